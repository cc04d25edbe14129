"""Per-partition producer state, the append rules (DESIGN.md §3) and the
marker rules of transactions (DESIGN.md §4, transaction versions 2 and 1).

For every producer id that wrote to a partition the store keeps its epoch, the
sequence ranges and offsets of its last five batches (enough to recognize any
retry of a batch still in flight, since a producer has at most five in flight
per partition), timestamps, the highest coordinator epoch of its markers, the
first offset of its open transaction, and the last marker written for it.

Two steps, as Kafka's ProducerAppendInfo: `check_append` / `check_marker`
decide without changing anything (an `Append`, a `Duplicate` carrying the
original offset, `NeedsVerification`, a `WriteMarker`, a `DuplicateMarker`, or
a `Rejection`), and `replay` applies a batch (data or control) that has been
given an offset. Live appends, markers and recovery all go through `replay`,
so the state after a restart is the state before it. Entries are frozen
values: a check can never leave a trace, and a copy of the table is a copy of
its dict.

Append rules, in the order they are checked:

1. no producer id (-1): not idempotent, always appended, no state;
2. control batches: refused (markers come only through WriteTxnMarkers);
3. epoch below the current one: INVALID_PRODUCER_EPOCH (PRODUCER_FENCED for
   transactional batches, fatal for a zombie);
4. same epoch and the same first and last sequence as one of the last five
   batches: a duplicate; nothing is written, the original offset is returned;
5. the producer has an open transaction on this partition: a
   non-transactional batch, or a transactional one of a higher epoch (the
   open transaction must be ended by its marker first), is INVALID_TXN_STATE;
6. unknown producer id: the batch must start at sequence 0;
7. epoch above the current one: the batch must start at sequence 0, the epoch
   moves and the cached batches of the old epoch are dropped;
8. same epoch: the batch must start at last sequence + 1 (wrapping at 2^31),
   or at 0 when the entry has no batches yet (a new producer, or the first
   transaction after a marker bumped the epoch);
9. anything else: OUT_OF_ORDER_SEQUENCE_NUMBER naming the expected sequence;
10. a transactional batch that would open a transaction here (no open one
    yet) is appended only once the transaction coordinator has confirmed
    that this partition is in the producer's transaction (transaction
    version 2): until then the decision is `NeedsVerification`, and the
    runtime asks the coordinator and checks again with txn_verified=True.

A coordinator's own append (a conditional append, `sequenced=False`) skips
the sequence rules 4 and 6-9, as Kafka's coordinator appends do: its
condition on the log end already makes it land once, and the group
coordinator numbers a producer's offset batches from what it reads of the
log, which compaction thins (a version-1 producer keeps its epoch across
transactions, so a number reused after a marker of that epoch would be
taken for a retry and the offsets silently dropped). The epoch rules still
fence.

Marker rules (`check_marker`), in order. A marker names its producer's
transaction version (docs/coordinator.md, "Transaction versions"): version 2
bumps the epoch at every transaction, version 1 (Kafka's clients) keeps it,
so its markers are told apart by the decision's timestamp, which the
coordinator makes strictly increasing per producer and the store writes as
the control batch's timestamp (so it is replicated and replayed with it).

1. a marker with an unknown type, a negative producer id, an epoch outside
   int16, an unknown transaction version, or of version 1 without a
   timestamp: INVALID_REQUEST;
2. no state for the producer (the partition was added to the transaction but
   never written, or its state expired): the marker is written and creates
   the entry (Kafka does the same);
3. coordinator epoch below the highest one seen in this producer's markers on
   this partition: TRANSACTION_COORDINATOR_FENCED (the sender is a zombie
   coordinator). Kept per producer, as Kafka does, not per partition:
   coordinator epochs count per __transaction_state partition, so producers
   whose transactional ids live on different coordinator partitions carry
   unrelated coordinator epochs;
4. the same producer epoch and type as the last marker written for this
   producer (version 1: and the same timestamp): an idempotent retry;
   nothing is written, the original offset is returned;
5. version 2: producer epoch not strictly above the producer's current
   epoch: INVALID_PRODUCER_EPOCH. The coordinator bumps the epoch at every
   EndTxn, so this refuses a delayed marker of an earlier transaction that
   would otherwise end a later one (the hole Jepsen found in the old rules);
6. version 1: producer epoch below the producer's current epoch:
   INVALID_PRODUCER_EPOCH (equal is the rule: the marker carries the
   data's epoch; above is a fence);
7. version 1: the last marker written for this producer has the same epoch
   and a timestamp at or above this one's: INVALID_PRODUCER_EPOCH. It is a
   delayed marker of an earlier transaction, which would otherwise end the
   producer's next transaction here at the same epoch: the same hole, closed
   by the timestamp where version 2 closes it by the epoch;
8. otherwise the marker is written: the producer's epoch moves to the
   marker's (version 1: usually stays), its open transaction (if any) ends,
   an ABORT adds the transaction to the partition's aborted index.

Unknown producers must start at 0. Kafka accepts an unknown producer at any
sequence after its state was lost to log truncation; we keep producer state in
snapshots rather than deriving it from old batches, so it is never lost to
retention. It is lost only when a producer stays idle longer than
`producer_id_expiration_ms` (never while it has an open transaction); such a
producer gets OUT_OF_ORDER_SEQUENCE_NUMBER (fatal) on its next batch and must
be re-initialized. Expiry is judged by the store's clock (the time of the
producer's last append), not by the batches' timestamps, so records carrying
old event times do not expire their producer.

The LSO needs the first offset of every unstable transaction: open ones, and
ended ones whose marker is not yet durable (Kafka's "unreplicated"
transactions): until the marker is below the high watermark a crash would
bring the transaction back as open, so readers must not go past it yet.
`first_unstable_offset` is that minimum, kept incrementally.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import (
    MARKER_ABORT,
    MARKER_COMMIT,
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    next_sequence,
)

from ...common.kernel import limits
from ...common.kernel.invariants import InvariantViolation, invariant
from .outcomes import Rejection

# How many of a producer's batches are remembered per partition for dedup.
CACHED_BATCHES = limits.MAX_IN_FLIGHT_BATCHES
NO_OFFSET = -1
NO_COORDINATOR_EPOCH = -1
NO_TIME_MS = -1
# Transaction versions a marker may name (0 is version 2: the proto default).
TXN_VERSION_1 = 1
TXN_VERSION_2 = 2
TXN_VERSIONS = (0, TXN_VERSION_1, TXN_VERSION_2)
# Kafka's producer.id.expiration.ms default: one day.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 60 * 60 * 1000
MARKER_NAMES = {MARKER_ABORT: "ABORT", MARKER_COMMIT: "COMMIT"}


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
class MarkerMetadata:
    """The last marker written for a producer on a partition: an identical
    retry of it is answered with its offset instead of being written again."""

    producer_epoch: int
    control_type: int
    offset: int
    # The control batch's timestamp (for a version-1 marker, its decision's).
    timestamp_ms: int = NO_TIME_MS


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
    # The highest coordinator epoch of this producer's markers here.
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    # First offset of the producer's open transaction here (NO_OFFSET: none).
    current_txn_first_offset: int = NO_OFFSET
    # The store's clock when that transaction's first batch was appended
    # (for the age of the oldest open transaction).
    current_txn_start_time_ms: int = NO_TIME_MS
    last_marker: MarkerMetadata | None = None

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def has_open_txn(self) -> bool:
        return self.current_txn_first_offset != NO_OFFSET

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
class TxnMarker:
    """A COMMIT or ABORT marker for one producer, as the coordinator sends it
    (or as replay reads it back from its control batch)."""

    producer_id: int
    producer_epoch: int
    control_type: int
    coordinator_epoch: int
    # The producer's transaction version (TXN_VERSION_*; 0: version 2). Only
    # the checks read it; replay does not know it and needs not.
    transaction_version: int = TXN_VERSION_2
    # The control batch's timestamp: version 1's decision timestamp; for
    # version 2, NO_TIME_MS until written (then the store's clock).
    timestamp_ms: int = NO_TIME_MS

    @property
    def is_version_1(self) -> bool:
        return self.transaction_version == TXN_VERSION_1

    @property
    def name(self) -> str:
        return MARKER_NAMES.get(self.control_type, f"type {self.control_type}")


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended on this partition.

    last_stable_offset is the LSO right after the marker, ignoring the high
    watermark: min(first offsets of the other open transactions, marker
    offset + 1). The aborted index keeps it so a reader can stop looking for
    overlapping aborted transactions (see core/txn_index.py)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    last_stable_offset: int


@dataclass(frozen=True, slots=True)
class Append:
    """The batch goes to the end of the log."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The batch is a retry of one already appended: write nothing, answer
    with the original offset."""

    base_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class NeedsVerification:
    """The batch would open a transaction on this partition: ask the
    transaction coordinator first, then check again with txn_verified=True."""


@dataclass(frozen=True, slots=True)
class WriteMarker:
    """The marker goes to the end of the log."""


@dataclass(frozen=True, slots=True)
class DuplicateMarker:
    """The marker repeats the last one written for this producer: write
    nothing, answer with its offset."""

    offset: int


APPEND = Append()
NEEDS_VERIFICATION = NeedsVerification()
WRITE_MARKER = WriteMarker()
AppendDecision = Append | Duplicate | NeedsVerification | Rejection
MarkerDecision = WriteMarker | DuplicateMarker | Rejection


def check_append(
    entry: ProducerEntry | None, header: BatchHeader, *, topic_partition: str,
    txn_verified: bool = False, sequenced: bool = True,
) -> AppendDecision:
    """Decides on a batch against a producer's current entry. Reads only.
    `sequenced` False: a coordinator's conditional append (see above)."""
    producer_id = header.producer_id
    if producer_id == NO_PRODUCER_ID:
        return APPEND
    epoch = header.producer_epoch
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
        duplicate = entry.find_duplicate(header) if sequenced else None
        if duplicate is not None:
            return Duplicate(duplicate.base_offset, duplicate.record_count)
        if entry.has_open_txn:
            if not header.is_transactional:
                return Rejection(
                    ErrorCode.INVALID_TXN_STATE,
                    f"{who}: a non-transactional batch while the producer's transaction "
                    f"(epoch {entry.producer_epoch}, from offset "
                    f"{entry.current_txn_first_offset}) is open on this partition",
                )
            if epoch > entry.producer_epoch:
                if not txn_verified:
                    # Usually the previous transaction's marker is still on
                    # its way (the producer's next transaction can start as
                    # soon as EndTxn answers). The coordinator answers the
                    # verification only once that transaction's markers have
                    # all landed, so ask it first and check again after.
                    rejection = _check_sequence(entry, header, who=who) if sequenced else None
                    return rejection or NEEDS_VERIFICATION
                # Verified, yet no marker came: a transaction the coordinator
                # no longer knows is hanging here (the admin tools abort it).
                return Rejection(
                    ErrorCode.INVALID_TXN_STATE,
                    f"{who}: the producer's transaction of epoch {entry.producer_epoch} "
                    f"(from offset {entry.current_txn_first_offset}) is still open on this "
                    "partition; its marker must end it before a new epoch writes",
                )
    sequence_rejection = _check_sequence(entry, header, who=who) if sequenced else None
    if sequence_rejection is not None:
        return sequence_rejection
    opens_txn = header.is_transactional and (entry is None or not entry.has_open_txn)
    if opens_txn and not txn_verified:
        return NEEDS_VERIFICATION
    return APPEND


def _check_sequence(
    entry: ProducerEntry | None, header: BatchHeader, *, who: str
) -> Rejection | None:
    sequence = header.base_sequence
    if entry is None:
        if sequence != 0:
            return Rejection(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"{who}: no state for this producer (new, or expired after being idle), "
                f"so its first batch must have sequence 0; expected sequence 0, "
                f"received {sequence}",
            )
        return None
    if header.producer_epoch > entry.producer_epoch:
        if sequence != 0:
            return Rejection(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"{who}: a new epoch (current {entry.producer_epoch}) must start at "
                f"sequence 0; expected sequence 0, received {sequence}",
            )
        return None
    last = entry.last_sequence
    expected = 0 if last == NO_SEQUENCE else next_sequence(last)
    if sequence != expected:
        cached = ", ".join(f"{b.first_sequence}..{b.last_sequence}" for b in entry.batches)
        return Rejection(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"{who}: expected sequence {expected}, received {sequence} "
            f"(batch {sequence}..{header.last_sequence}; last batches: {cached or 'none'})",
        )
    return None


def check_marker(
    entry: ProducerEntry | None, marker: TxnMarker, *, topic_partition: str
) -> MarkerDecision:
    """Decides on a COMMIT/ABORT marker against the producer's entry. Reads only."""
    who = (
        f"{marker.name} marker of producer {marker.producer_id} (epoch "
        f"{marker.producer_epoch}, coordinator epoch {marker.coordinator_epoch}) "
        f"on {topic_partition}"
    )
    if marker.control_type not in MARKER_NAMES:
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"{who}: unknown marker type {marker.control_type}; expected "
            f"{MARKER_ABORT} (ABORT) or {MARKER_COMMIT} (COMMIT)",
        )
    if marker.producer_id < 0:
        return Rejection(ErrorCode.INVALID_REQUEST, f"{who}: a marker needs a producer id >= 0")
    if not 0 <= marker.producer_epoch <= MAX_PRODUCER_EPOCH:
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"{who}: producer epoch {marker.producer_epoch} is outside 0..{MAX_PRODUCER_EPOCH}",
        )
    if marker.transaction_version not in TXN_VERSIONS:
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"{who}: transaction version {marker.transaction_version} is unknown; expected "
            f"{TXN_VERSION_1} or {TXN_VERSION_2}",
        )
    v1 = marker.is_version_1
    if v1 and marker.timestamp_ms <= 0:
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"{who}: a version-1 marker needs its decision's timestamp (> 0), received "
            f"{marker.timestamp_ms}",
        )
    if entry is None:
        return WRITE_MARKER
    if marker.coordinator_epoch < entry.coordinator_epoch:
        return Rejection(
            ErrorCode.TRANSACTION_COORDINATOR_FENCED,
            f"{who}: coordinator epoch {marker.coordinator_epoch} is below "
            f"{entry.coordinator_epoch}, the highest seen for this producer here; "
            "the sender is a zombie coordinator",
        )
    last = entry.last_marker
    if (
        last is not None
        and last.producer_epoch == marker.producer_epoch
        and last.control_type == marker.control_type
        and (not v1 or last.timestamp_ms == marker.timestamp_ms)
    ):
        return DuplicateMarker(last.offset)
    if not v1:
        if marker.producer_epoch <= entry.producer_epoch:
            return Rejection(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"{who}: a marker's producer epoch must be strictly above the producer's "
                f"current epoch {entry.producer_epoch} (transaction version 2); expected "
                f"> {entry.producer_epoch}, received {marker.producer_epoch} (a delayed "
                "marker of an earlier transaction?)",
            )
        return WRITE_MARKER
    if marker.producer_epoch < entry.producer_epoch:
        return Rejection(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"{who}: a version-1 marker's producer epoch must be at least the producer's "
            f"current epoch; expected >= {entry.producer_epoch}, received "
            f"{marker.producer_epoch} (a marker of a fenced producer?)",
        )
    if last is not None and last.producer_epoch == marker.producer_epoch \
            and last.timestamp_ms >= marker.timestamp_ms:
        return Rejection(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"{who}: the last marker of this producer here (epoch {last.producer_epoch}, "
            f"{MARKER_NAMES.get(last.control_type, last.control_type)} at offset "
            f"{last.offset}) was decided at {last.timestamp_ms}; expected a timestamp above "
            f"it, received {marker.timestamp_ms} (a delayed marker of an earlier "
            "transaction)",
        )
    return WRITE_MARKER


def apply_append(
    entry: ProducerEntry | None, header: BatchHeader, base_offset: int, append_time_ms: int
) -> ProducerEntry:
    """The entry after appending data batch `header` at `base_offset` (no
    checks: recovery replays what was accepted before)."""
    invariant(header.producer_id != NO_PRODUCER_ID, "apply_append without a producer id")
    invariant(not header.is_control, "apply_append with a control batch")
    meta = BatchMetadata(
        first_sequence=header.base_sequence,
        last_sequence=header.last_sequence,
        base_offset=base_offset,
        # The offsets the batch spans: the same as its record count, except
        # for a batch compaction rewrote (replayed when recovery falls back
        # past the newest snapshot), whose records have gaps.
        record_count=header.last_offset_delta + 1,
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
    txn_start_time_ms = entry.current_txn_start_time_ms
    if header.is_transactional and txn_first_offset == NO_OFFSET:
        txn_first_offset = base_offset
        txn_start_time_ms = append_time_ms
    return replace(
        entry,
        producer_epoch=header.producer_epoch,
        batches=batches,
        last_timestamp_ms=max(entry.last_timestamp_ms, header.max_timestamp_ms),
        last_append_time_ms=max(entry.last_append_time_ms, append_time_ms),
        current_txn_first_offset=txn_first_offset,
        current_txn_start_time_ms=txn_start_time_ms,
    )


def apply_marker(
    entry: ProducerEntry | None, marker: TxnMarker, offset: int, append_time_ms: int
) -> ProducerEntry:
    """The entry after a marker at `offset`: the epoch moves to the marker's,
    the open transaction (if any) ends, the coordinator epoch and the marker
    are remembered. No checks (recovery replays what was accepted before)."""
    if entry is None:
        entry = ProducerEntry(producer_id=marker.producer_id, producer_epoch=marker.producer_epoch)
    # A new epoch starts with no cached batches (its sequences restart at 0);
    # the same epoch (version 1) keeps them: the producer's sequences go on
    # into its next transaction, and a late retry is still recognised.
    batches = entry.batches if marker.producer_epoch == entry.producer_epoch else ()
    return replace(
        entry,
        producer_epoch=marker.producer_epoch,
        batches=batches,
        last_append_time_ms=max(entry.last_append_time_ms, append_time_ms),
        coordinator_epoch=max(entry.coordinator_epoch, marker.coordinator_epoch),
        current_txn_first_offset=NO_OFFSET,
        current_txn_start_time_ms=NO_TIME_MS,
        last_marker=MarkerMetadata(marker.producer_epoch, marker.control_type, offset,
                                   marker.timestamp_ms),
    )


def stable_offset_after(open_first_offsets: Iterable[int], marker_offset: int) -> int:
    """The LSO right after a marker at marker_offset, before the high
    watermark is taken into account."""
    return min((*open_first_offsets, marker_offset + 1))


class ProducerStateManager:
    """The producer table of one partition, and its unstable transactions."""

    __slots__ = ("_first_unstable", "_open", "_producers", "_unreplicated", "topic_partition")

    def __init__(
        self, topic_partition: str, producers: Iterable[ProducerEntry] | None = None,
        unreplicated: Iterable[tuple[int, int]] = (),
    ) -> None:
        """`producers` and `unreplicated` come from a snapshot (the
        transactions ended by markers its replica's HW had not passed:
        `unreplicated()`)."""
        self.topic_partition = topic_partition
        self._producers: dict[int, ProducerEntry] = {
            e.producer_id: e for e in producers or ()
        }
        # producer id -> first offset of its open transaction.
        self._open: dict[int, int] = {
            pid: e.current_txn_first_offset
            for pid, e in self._producers.items() if e.has_open_txn
        }
        # Ended transactions whose marker is not durable yet, in marker order:
        # (marker offset, first offset).
        self._unreplicated: list[tuple[int, int]] = sorted(unreplicated)
        self._first_unstable: int | None = min(
            (*self._open.values(), *(first for _m, first in self._unreplicated)),
            default=None)

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

    # ------------------------------------------------------------ decisions

    def check_append(self, header: BatchHeader, *, txn_verified: bool = False,
                     sequenced: bool = True) -> AppendDecision:
        return check_append(
            self._producers.get(header.producer_id), header,
            topic_partition=self.topic_partition, txn_verified=txn_verified,
            sequenced=sequenced,
        )

    def check_marker(self, marker: TxnMarker) -> MarkerDecision:
        return check_marker(
            self._producers.get(marker.producer_id), marker,
            topic_partition=self.topic_partition,
        )

    # --------------------------------------------------------------- replay

    def replay(
        self, header: BatchHeader, base_offset: int, append_time_ms: int, *,
        control: tuple[int, int] | None = None,
    ) -> CompletedTxn | None:
        """Applies an appended batch: the one way batches change this table.
        A control batch comes with its (marker type, coordinator epoch) and
        returns the transaction it ended here, if one was open; its
        timestamp is the marker's (version 1: its decision's)."""
        pid = header.producer_id
        if header.is_control:
            if control is None:
                raise InvariantViolation(
                    f"{self.topic_partition}: control batch at {base_offset} replayed "
                    "without its marker"
                )
            control_type, coordinator_epoch = control
            return self.replay_marker(
                TxnMarker(pid, header.producer_epoch, control_type, coordinator_epoch,
                          timestamp_ms=header.max_timestamp_ms),
                base_offset, append_time_ms,
            )
        if pid == NO_PRODUCER_ID:
            return None
        entry = apply_append(self._producers.get(pid), header, base_offset, append_time_ms)
        self._producers[pid] = entry
        if entry.has_open_txn and pid not in self._open:
            self._open[pid] = entry.current_txn_first_offset
            if self._first_unstable is None:
                # A new transaction starts at the log end, above every other one.
                self._first_unstable = entry.current_txn_first_offset
        return None

    def replay_marker(
        self, marker: TxnMarker, offset: int, append_time_ms: int
    ) -> CompletedTxn | None:
        pid = marker.producer_id
        previous = self._producers.get(pid)
        self._producers[pid] = apply_marker(previous, marker, offset, append_time_ms)
        first_offset = self._open.pop(pid, None)
        if first_offset is None:
            return None
        # Still unstable until the marker is durable (see on_high_watermark).
        self._unreplicated.append((offset, first_offset))
        return CompletedTxn(
            producer_id=pid,
            first_offset=first_offset,
            last_offset=offset,
            aborted=marker.control_type == MARKER_ABORT,
            last_stable_offset=stable_offset_after(self._open.values(), offset),
        )

    def on_high_watermark(self, high_watermark: int) -> None:
        """Ended transactions whose marker is now durable stop holding the LSO."""
        dropped = False
        while self._unreplicated and self._unreplicated[0][0] < high_watermark:
            self._unreplicated.pop(0)
            dropped = True
        if dropped:
            self._first_unstable = min(
                (*self._open.values(), *(first for _m, first in self._unreplicated)),
                default=None,
            )

    def unreplicated(self) -> tuple[tuple[int, int], ...]:
        """The ended transactions whose marker the HW has not passed yet,
        (marker offset, first offset), in marker order: a snapshot keeps
        them, or a replica restarting from it would let their records below
        its LSO before their marker is replicated."""
        return tuple(self._unreplicated)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open (or not yet durably ended)
        transaction; None when there is none."""
        return self._first_unstable

    @property
    def open_txn_count(self) -> int:
        return len(self._open)

    def open_entries(self) -> list[ProducerEntry]:
        """The entries of the producers with an open transaction here."""
        return [self._producers[pid] for pid in self._open]

    def oldest_open_txn_start_ms(self) -> int | None:
        """The store's clock when the oldest open transaction started."""
        starts = [self._producers[pid].current_txn_start_time_ms for pid in self._open]
        return min(starts, default=None)

    def remove_expired(self, now_ms: int, expiration_ms: int,
                       keep: Collection[int] = ()) -> list[int]:
        """Drops producers idle for expiration_ms (by the store's clock) that
        have no open transaction and are not in `keep`; returns their ids."""
        expired = [
            pid
            for pid, e in self._producers.items()
            if not e.has_open_txn and now_ms - e.last_append_time_ms >= expiration_ms
            and pid not in keep
        ]
        for pid in expired:
            del self._producers[pid]
        return expired
