"""Log compaction: which records of a compacted partition survive (Kafka's
log cleaner, per stored batch instead of per segment).

A pass cleans the offsets [log start, end) of one partition, where `end` is
at most the *first uncleanable offset*: min(LSO, HW, base offset of the last
batch, newest producer-state snapshot). So it never touches an open
transaction (everything below the LSO is decided), anything not yet durable,
the batch that fixes the log end offset, or a batch that recovery would
replay on top of the newest snapshot (the runtime takes a snapshot first when
the newest one is too old).

Two phases, as Kafka's cleaner:

1. `OffsetMapBuilder` reads the *dirty* part [clean offset, end) — what was
   written since the previous pass — and keeps the newest offset per key
   (records of aborted transactions, records without a key and control
   batches do not count). It holds at most `max_keys` keys: when full, the
   pass ends below the batch that did not fit, and the next pass goes on.
2. `Cleaner` reads every batch in [log start, end) in order and decides per
   record. A record survives unless
   * its transaction was aborted (the aborted index has it: every
     transaction below the LSO is decided, and an ABORT's index entry is
     written with its marker), or it has no key;
   * the offset map has a newer offset for its key;
   * it is a tombstone (null value) that entered the cleaned part at least
     `delete.retention.ms` ago (below the *removal horizon*, see
     CompactionState).
   A control batch (COMMIT/ABORT marker) is removed only when no record of
   its transaction survives this pass and it, too, is below the removal
   horizon (Kafka's rule: a reader that saw a transaction's records also
   sees how it ended; read_committed filtering never needs a removed one).
   A removed ABORT marker takes its aborted-index entry with it.

   Per batch: KEEP (nothing removed), REWRITE (some records removed: the
   batch keeps its header's offsets, partition leader epoch, producer fields
   and timestamps, and the surviving records their offsets) or DROP (nothing
   left). Except: the
   last batch in range of each producer still in the producer table is
   never dropped, only emptied (a header with no records, or the marker
   kept), as Kafka keeps each active producer's last batch: recovery that
   falls back to an older snapshot or to the log start still replays that
   producer's epoch and last sequence from it. A marker carries no
   sequence: when the markers after the producer's last data batch are of
   that batch's epoch (transaction version 1, whose producers keep their
   epoch and sequences across transactions), that data batch stays too
   (emptied), since it still says where the producer's sequence is. The
   group coordinator, which numbers a producer's offset batches from what
   the log says, needs it as much as recovery does.

   The leader-epoch cache (core/leader_epochs.py) is stored apart from the
   batches, so compaction leaves it as it is, even when it drops an epoch's
   first batch (as in Kafka, that epoch's start offset then names an offset
   no batch holds any more).

`CompactionState` is what persists between passes (the `K` key): the clean
offset (Kafka's cleaner checkpoint), the bytes below it (for the dirty
ratio), and a short history of (clean offset, time) from which the removal
horizon follows: a tombstone at offset o entered the cleaned part at the
time of the first pass whose clean offset went past o (KIP-534's rule: the
clock starts when a tombstone is first cleaned, not at its timestamp, which
a producer chooses).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from oncelog.wire.records import MARKER_ABORT, BatchHeader, RecordKey

from ...common.kernel.invariants import invariant
from .codec import CorruptValueError, seal, unseal
from .txn_index import AbortedTxn

COMPACTION_STATE_VERSION = 1
NO_REMOVAL_MS = -1
# The history keeps at most about this many entries per delete.retention.ms:
# passes within one slice of that length share an entry (the later time),
# which delays a tombstone's removal by less than one slice.
HISTORY_SLICES = 32
_STATE_HEAD = struct.Struct(">qqqI")
_HISTORY_ENTRY = struct.Struct(">qq")


@dataclass(frozen=True, slots=True)
class CleanedUpTo:
    """Everything below clean_offset had been cleaned once by cleaned_at_ms."""

    clean_offset: int
    cleaned_at_ms: int


@dataclass(frozen=True, slots=True)
class CompactionState:
    """One partition's cleaning progress, persisted after every pass."""

    # Everything below was cleaned at least once; the dirty part starts here.
    clean_offset: int = 0
    # Stored bytes of the batches below clean_offset after the last pass.
    clean_bytes: int = 0
    # Oldest first; clean offsets and times both increase.
    history: tuple[CleanedUpTo, ...] = ()
    # When a tombstone or marker kept only for delete.retention.ms becomes
    # removable (NO_REMOVAL_MS: none is waiting).
    next_removal_ms: int = NO_REMOVAL_MS

    def dirty_bytes(self, size_bytes: int) -> int:
        return max(0, size_bytes - self.clean_bytes)

    def removal_horizon(self, now_ms: int, delete_retention_ms: int) -> int:
        """Tombstones and markers below this offset entered the cleaned part
        at least delete_retention_ms ago."""
        horizon = 0
        for entry in self.history:
            if now_ms - entry.cleaned_at_ms < delete_retention_ms:
                break
            horizon = entry.clean_offset
        return horizon

    def entered_cleaned_part_ms(self, offset: int, now_ms: int) -> int:
        """When the record at `offset` was first cleaned (now_ms: in this pass)."""
        for entry in self.history:
            if offset < entry.clean_offset:
                return entry.cleaned_at_ms
        return now_ms

    def after_pass(
        self, *, clean_offset: int, clean_bytes: int, now_ms: int, delete_retention_ms: int,
        next_removal_ms: int,
    ) -> CompactionState:
        invariant(
            clean_offset >= self.clean_offset,
            lambda: f"compaction moved the clean offset back from {self.clean_offset} "
            f"to {clean_offset}",
        )
        history = list(self.history)
        if clean_offset > self.clean_offset:
            slice_ms = max(1, delete_retention_ms // HISTORY_SLICES)
            if history and history[-1].cleaned_at_ms // slice_ms == now_ms // slice_ms:
                # Same slice: the newer entry stands for both (a later time
                # only keeps tombstones longer).
                history[-1] = CleanedUpTo(clean_offset, now_ms)
            else:
                history.append(CleanedUpTo(clean_offset, now_ms))
        # Of the entries old enough to be a horizon, only the newest matters.
        old = [i for i, e in enumerate(history) if now_ms - e.cleaned_at_ms >= delete_retention_ms]
        if old:
            del history[: old[-1]]
        while len(history) > 2 * HISTORY_SLICES:
            # delete.retention.ms grew since the entries were sliced: merge the
            # two closest in time (dropping the older keeps tombstones longer).
            gaps = [history[i + 1].cleaned_at_ms - history[i].cleaned_at_ms
                    for i in range(len(history) - 1)]
            del history[gaps.index(min(gaps))]
        return CompactionState(
            clean_offset=clean_offset, clean_bytes=clean_bytes, history=tuple(history),
            next_removal_ms=next_removal_ms,
        )

    def after_retention(self, new_log_start_offset: int, deleted_bytes: int) -> CompactionState:
        """Retention (cleanup.policy=compact,delete) deleted every batch below
        new_log_start_offset, `deleted_bytes` in all."""
        if new_log_start_offset >= self.clean_offset:
            clean_offset, clean_bytes = new_log_start_offset, 0
        else:
            # Everything deleted lay below the clean offset. (Clamped: the
            # count only steers the dirty ratio, never what is kept.)
            clean_offset = self.clean_offset
            clean_bytes = max(0, self.clean_bytes - deleted_bytes)
        history = tuple(e for e in self.history if e.clean_offset > new_log_start_offset)
        return replace(self, clean_offset=clean_offset, clean_bytes=clean_bytes, history=history)


def initial_state(log_start_offset: int) -> CompactionState:
    """A partition never cleaned: everything from the log start is dirty."""
    return CompactionState(clean_offset=log_start_offset)


def encode_compaction_state(state: CompactionState) -> bytes:
    parts = [_STATE_HEAD.pack(state.clean_offset, state.clean_bytes, state.next_removal_ms,
                              len(state.history))]
    parts.extend(_HISTORY_ENTRY.pack(e.clean_offset, e.cleaned_at_ms) for e in state.history)
    return seal(COMPACTION_STATE_VERSION, b"".join(parts))


def decode_compaction_state(data: bytes, *, what: str) -> CompactionState:
    payload = unseal(data, version=COMPACTION_STATE_VERSION, what=what)
    if len(payload) < _STATE_HEAD.size:
        raise CorruptValueError(f"{what}: {len(payload)}-byte payload is too short")
    clean_offset, clean_bytes, next_removal_ms, count = _STATE_HEAD.unpack_from(payload, 0)
    if len(payload) != _STATE_HEAD.size + count * _HISTORY_ENTRY.size:
        raise CorruptValueError(
            f"{what}: {len(payload)}-byte payload does not hold {count} history entries"
        )
    history = tuple(
        CleanedUpTo(*_HISTORY_ENTRY.unpack_from(payload, offset))
        for offset in range(_STATE_HEAD.size, len(payload), _HISTORY_ENTRY.size)
    )
    if clean_offset < 0 or clean_bytes < 0 or any(
        a.clean_offset >= b.clean_offset for a, b in zip(history, history[1:], strict=False)
    ):
        raise CorruptValueError(f"{what}: offsets out of order")
    return CompactionState(int(clean_offset), int(clean_bytes), history, int(next_removal_ms))


def compaction_due(
    state: CompactionState, *, size_bytes: int, first_uncleanable_offset: int,
    min_cleanable_dirty_ratio: float, now_ms: int,
) -> bool:
    """A pass is due when there is something new to clean and the bytes
    written since the last pass are at least min_cleanable_dirty_ratio of the
    log (Kafka's trigger), or when a tombstone or marker kept for
    delete.retention.ms has become removable."""
    if state.next_removal_ms != NO_REMOVAL_MS and now_ms >= state.next_removal_ms:
        return True
    if first_uncleanable_offset <= state.clean_offset or size_bytes <= 0:
        return False
    return state.dirty_bytes(size_bytes) >= min_cleanable_dirty_ratio * size_bytes


def aborted_by_producer(entries: Iterable[AbortedTxn]) -> dict[int, list[AbortedTxn]]:
    grouped: dict[int, list[AbortedTxn]] = {}
    for entry in entries:
        grouped.setdefault(entry.producer_id, []).append(entry)
    return grouped


def _is_aborted(aborted: dict[int, list[AbortedTxn]], header: BatchHeader) -> bool:
    if not header.is_transactional:
        return False
    entries = aborted.get(header.producer_id)
    return entries is not None and any(
        e.contains(header.producer_id, header.base_offset) for e in entries
    )


class OffsetMapBuilder:
    """Phase 1: the newest offset of every key in the dirty part."""

    def __init__(self, *, aborted: dict[int, list[AbortedTxn]], max_keys: int) -> None:
        invariant(max_keys >= 1, lambda: f"max_keys must be >= 1, got {max_keys}")
        self.newest: dict[bytes, int] = {}
        self._aborted = aborted
        self._max_keys = max_keys

    def add(self, header: BatchHeader, records: Sequence[RecordKey]) -> bool:
        """Adds one batch (in offset order). Returns False, adding nothing,
        when the batch might not fit; the pass then ends below it. The first
        batch is always taken, so every pass makes progress."""
        if header.is_control or _is_aborted(self._aborted, header):
            return True
        newest = self.newest
        if newest and len(newest) + len(records) > self._max_keys:
            return False
        for record in records:
            if record.key is not None:
                newest[record.key] = record.offset
        return True


class BatchAction(enum.Enum):
    KEEP = "keep"
    REWRITE = "rewrite"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class BatchDecision:
    header: BatchHeader
    action: BatchAction
    # REWRITE: the offsets of the records that stay (empty: only the header).
    retained: frozenset[int] = frozenset()
    # A dropped ABORT marker: its aborted-index entry goes with it.
    drops_aborted_txn: bool = False


@dataclass(slots=True)
class CleanerStats:
    records_removed: int = 0
    tombstones_removed: int = 0
    markers_removed: int = 0
    aborted_records_removed: int = 0


@dataclass(slots=True)
class _Deferred:
    """An active producer's batch that would be dropped, unless it turns
    out to be that producer's last batch in the pass."""

    header: BatchHeader
    drops_aborted_txn: bool


@dataclass(slots=True)
class Cleaner:
    """Phase 2: decides every batch of [log start, end), in offset order."""

    newest: dict[bytes, int]
    state: CompactionState
    now_ms: int
    delete_retention_ms: int
    aborted: dict[int, list[AbortedTxn]]
    active_producers: frozenset[int]
    stats: CleanerStats = field(default_factory=CleanerStats)
    next_removal_ms: int = NO_REMOVAL_MS
    _horizon: int = -1
    # producer id -> whether a record of its current transaction survives.
    _txn_retained: dict[int, bool] = field(default_factory=dict)
    _deferred: dict[int, _Deferred] = field(default_factory=dict)
    # producer id -> its last data batch, deferred while only markers of its
    # epoch follow it (they leave its sequence where the batch says).
    _sequence_holders: dict[int, _Deferred] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._horizon = self.state.removal_horizon(self.now_ms, self.delete_retention_ms)

    def _keep_until_horizon(self, offset: int) -> None:
        """A tombstone or marker stays only for delete.retention.ms: note when
        it becomes removable, so a pass runs then."""
        due = self.state.entered_cleaned_part_ms(offset, self.now_ms) + self.delete_retention_ms
        if self.next_removal_ms == NO_REMOVAL_MS or due < self.next_removal_ms:
            self.next_removal_ms = due

    def clean(
        self, header: BatchHeader, records: Sequence[RecordKey], control_type: int | None = None,
    ) -> list[BatchDecision]:
        """Decides one batch (records: its RecordKeys; control_type: the
        marker type of a control batch). Returns the decisions that are final
        now: this batch's, and maybe an earlier deferred one's."""
        out: list[BatchDecision] = []
        pid = header.producer_id
        deferred = self._deferred.pop(pid, None) if pid >= 0 else None
        if deferred is not None:
            if header.is_control and not deferred.header.is_control \
                    and header.producer_epoch == deferred.header.producer_epoch:
                # A marker of the batch's epoch: the batch still holds the
                # producer's last sequence.
                self._sequence_holders[pid] = deferred
            else:
                # Not the producer's last batch after all.
                out.append(self._drop(deferred.header, deferred.drops_aborted_txn))
        holder = self._sequence_holders.get(pid) if pid >= 0 else None
        if holder is not None and holder is not deferred and (
                not header.is_control or header.producer_epoch != holder.header.producer_epoch):
            # A later data batch holds the sequence now, or a new epoch
            # restarted it.
            del self._sequence_holders[pid]
            out.append(self._drop(holder.header, holder.drops_aborted_txn))
        if header.is_control:
            invariant(control_type is not None,
                      lambda: f"control batch at {header.base_offset} without its marker type")
            txn_retained = self._txn_retained.pop(pid, False)
            if txn_retained:
                out.append(BatchDecision(header, BatchAction.KEEP))
            elif header.base_offset >= self._horizon:
                self._keep_until_horizon(header.base_offset)
                out.append(BatchDecision(header, BatchAction.KEEP))
            else:
                self._empty(header, out, drops_aborted_txn=control_type == MARKER_ABORT)
            return out
        invariant(
            len(records) == header.record_count,
            lambda: f"batch at {header.base_offset} has {header.record_count} records, "
            f"{len(records)} given",
        )
        aborted = _is_aborted(self.aborted, header)
        retained: list[int] = []
        for record in records:
            if aborted:
                self.stats.aborted_records_removed += 1
                continue
            if record.key is None:
                continue
            newest = self.newest.get(record.key)
            if newest is not None and newest > record.offset:
                continue
            if record.is_tombstone:
                if record.offset < self._horizon:
                    self.stats.tombstones_removed += 1
                    continue
                self._keep_until_horizon(record.offset)
            retained.append(record.offset)
        self.stats.records_removed += len(records) - len(retained)
        if header.is_transactional and not aborted:
            self._txn_retained[pid] = self._txn_retained.get(pid, False) or bool(retained)
        if len(retained) == len(records) and records:
            out.append(BatchDecision(header, BatchAction.KEEP))
        elif retained:
            out.append(BatchDecision(header, BatchAction.REWRITE, frozenset(retained)))
        else:
            self._empty(header, out, drops_aborted_txn=False)
        return out

    def _empty(self, header: BatchHeader, out: list[BatchDecision], *,
               drops_aborted_txn: bool) -> None:
        """Nothing of the batch needs to stay: drop it, unless it may be its
        producer's last batch (then wait and see)."""
        if header.producer_id in self.active_producers:
            self._deferred[header.producer_id] = _Deferred(header, drops_aborted_txn)
        else:
            out.append(self._drop(header, drops_aborted_txn))

    def _drop(self, header: BatchHeader, drops_aborted_txn: bool) -> BatchDecision:
        if header.is_control:
            self.stats.markers_removed += 1
        return BatchDecision(header, BatchAction.DROP, drops_aborted_txn=drops_aborted_txn)

    def finish(self) -> list[BatchDecision]:
        """The decisions still deferred: each is its producer's last batch in
        the pass, or its last data batch followed only by markers of its
        epoch, kept as a header with no records (a marker stays whole)."""
        out = []
        for deferred in (*self._deferred.values(), *self._sequence_holders.values()):
            header = deferred.header
            if header.is_control or header.record_count == 0:
                out.append(BatchDecision(header, BatchAction.KEEP))
            else:
                out.append(BatchDecision(header, BatchAction.REWRITE, frozenset()))
        self._deferred.clear()
        self._sequence_holders.clear()
        return out
