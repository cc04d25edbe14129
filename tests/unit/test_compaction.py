"""The compaction planner (core/compaction.py): which records survive.

Goal: Kafka's log-cleaner rules hold per record and per batch — the newest
record per key survives at its original offset; records without a key go;
tombstones stay for delete.retention.ms counted from the first pass that
cleaned them (not from their timestamp) and then go; records of aborted
transactions go and never count as "newest"; a marker stays while any record
of its transaction survives and for delete.retention.ms, and a removed ABORT
marker takes its aborted-index entry with it; a producer still in the
producer table keeps its last batch (as a header with no records, producer
fields intact), and its last data batch too when only markers of that
batch's epoch follow it (transaction version 1: they carry no sequence, and
the producer's sequence goes on); the offset map's bound ends a pass early. The persisted
cleaning state round-trips, rejects damage, slices its history and decides
when a pass is due.

Method: encode real batches at chosen offsets, run the two phases the way
log/cleaner.py does (OffsetMapBuilder over the dirty part, Cleaner over the
whole range), and apply the decisions with records.retain_records; then
read the resulting log back with iter_records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from oncelog import records as codec
from services.partition_store.core.codec import CorruptValueError, seal, unseal
from services.partition_store.core.compaction import (
    COMPACTION_STATE_VERSION,
    HISTORY_SLICES,
    NO_REMOVAL_MS,
    BatchAction,
    BatchDecision,
    CleanedUpTo,
    Cleaner,
    CompactionState,
    OffsetMapBuilder,
    aborted_by_producer,
    compaction_due,
    decode_compaction_state,
    encode_compaction_state,
    initial_state,
)
from services.partition_store.core.txn_index import AbortedTxn

DAY_MS = 24 * 3_600_000
NOW_MS = 1_700_000_000_000

Row = tuple[bytes | None, bytes | None]
# Everything below offset 1000 was first cleaned two days ago: tombstones and
# markers there are past the default delete.retention.ms.
CLEANED_LONG_AGO = CompactionState(history=(CleanedUpTo(1000, NOW_MS - 2 * DAY_MS),))


@dataclass(frozen=True)
class Stored:
    """One stored batch: its bytes at its base offset."""

    data: bytes

    @property
    def header(self) -> codec.BatchHeader:
        return codec.read_header(self.data)


def data(base: int, *rows: Row, pid: int = -1, epoch: int = 0, seq: int = -1,
         txn: bool = False, ts_ms: int = NOW_MS) -> Stored:
    encoded = codec.encode_batch(
        [(k, v, None, ts_ms) for k, v in rows], producer_id=pid, producer_epoch=epoch,
        base_sequence=seq if seq >= 0 or pid < 0 else 0, transactional=txn,
    )
    return Stored(codec.with_base_offset(encoded, base))


def marker(base: int, marker_type: int, *, pid: int, epoch: int = 1) -> Stored:
    return Stored(codec.encode_control_batch(
        marker=marker_type, coordinator_epoch=0, producer_id=pid, producer_epoch=epoch,
        timestamp_ms=NOW_MS, base_offset=base,
    ))


@dataclass
class Pass:
    decisions: dict[int, BatchDecision]
    log: list[Stored]
    cleaner: Cleaner


def run_pass(
    log: Sequence[Stored], *, state: CompactionState | None = None, now_ms: int = NOW_MS,
    delete_retention_ms: int = DAY_MS, aborted: Sequence[AbortedTxn] = (),
    active: frozenset[int] = frozenset(), max_keys: int = 1000, end: int | None = None,
) -> Pass:
    """Phase 1 over the dirty part, phase 2 over [log start, end), as
    log/cleaner.py drives them; returns the decisions and the log after them."""
    state = state or initial_state(log[0].header.base_offset)
    end = log[-1].header.next_offset if end is None else end
    grouped = aborted_by_producer(aborted)
    builder = OffsetMapBuilder(aborted=grouped, max_keys=max_keys)
    for batch in log:
        h = batch.header
        if h.base_offset < state.clean_offset or h.base_offset >= end:
            continue
        keys = () if h.is_control else tuple(codec.iter_record_keys(batch.data))
        if not builder.add(h, keys):
            end = h.base_offset
            break
    cleaner = Cleaner(newest=builder.newest, state=state, now_ms=now_ms,
                      delete_retention_ms=delete_retention_ms, aborted=grouped,
                      active_producers=active)
    decisions: dict[int, BatchDecision] = {}
    for batch in log:
        h = batch.header
        if h.base_offset >= end:
            break
        if h.is_control:
            out = cleaner.clean(h, (), codec.control_marker(batch.data)[0])
        else:
            out = cleaner.clean(h, tuple(codec.iter_record_keys(batch.data)))
        for d in out:
            assert d.header.base_offset not in decisions, "a batch decided twice"
            decisions[d.header.base_offset] = d
    for d in cleaner.finish():
        assert d.header.base_offset not in decisions, "a batch decided twice"
        decisions[d.header.base_offset] = d
    decided = {b.header.base_offset for b in log if b.header.base_offset < end}
    assert set(decisions) == decided, "every batch below the end gets exactly one decision"
    after = []
    for batch in log:
        decision = decisions.get(batch.header.base_offset)
        if decision is None or decision.action is BatchAction.KEEP:
            after.append(batch)
        elif decision.action is BatchAction.REWRITE:
            after.append(Stored(codec.retain_records(batch.data, decision.retained)))
    return Pass(decisions, after, cleaner)


def survivors(log: Sequence[Stored]) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every data record left."""
    return [(r.offset, r.key, r.value) for b in log if not b.header.is_control
            for r in codec.iter_records(b.data)]


def actions(result: Pass) -> dict[int, str]:
    return {o: d.action.value for o, d in sorted(result.decisions.items())}


def test_newest_record_per_key_survives_at_its_original_offset() -> None:
    log = [
        data(0, (b"a", b"a0"), (b"b", b"b0"), (b"c", b"c0")),
        data(3, (b"a", b"a1")),
        data(4, (b"b", b"b1"), (b"d", b"d0")),
        data(6, (b"a", b"a2")),
    ]
    result = run_pass(log)
    assert survivors(result.log) == [
        (2, b"c", b"c0"), (4, b"b", b"b1"), (5, b"d", b"d0"), (6, b"a", b"a2"),
    ]
    assert actions(result) == {0: "rewrite", 3: "drop", 4: "keep", 6: "keep"}
    rewritten = codec.validate_batch(result.log[0].data, max_size_bytes=1 << 20, compacted=True)
    original = log[0].header
    # The header keeps its span (offsets, hence next_offset) and timestamps.
    assert (rewritten.base_offset, rewritten.last_offset_delta, rewritten.record_count) == (0, 2, 1)
    assert rewritten.next_offset == original.next_offset
    assert rewritten.max_timestamp_ms == original.max_timestamp_ms
    assert result.cleaner.stats.records_removed == 3


def test_a_second_pass_changes_nothing_and_only_the_dirty_part_builds_the_map() -> None:
    log = [data(0, (b"a", b"1")), data(1, (b"a", b"2")), data(2, (b"b", b"1"))]
    first = run_pass(log)
    state = CompactionState(clean_offset=3, history=(CleanedUpTo(3, NOW_MS),))
    again = run_pass(first.log, state=state)
    assert survivors(again.log) == survivors(first.log) == [(1, b"a", b"2"), (2, b"b", b"1")]
    assert all(d.action is BatchAction.KEEP for d in again.decisions.values())
    # New dirty data supersedes records of the clean part.
    grown = [*first.log, data(3, (b"b", b"2"))]
    third = run_pass(grown, state=state)
    assert survivors(third.log) == [(1, b"a", b"2"), (3, b"b", b"2")]


def test_records_without_a_key_are_removed() -> None:
    log = [data(0, (None, b"x"), (b"k", b"1")), data(2, (None, b"y"))]
    result = run_pass(log)
    assert survivors(result.log) == [(1, b"k", b"1")]
    assert actions(result) == {0: "rewrite", 2: "drop"}


def test_tombstone_stays_for_delete_retention_after_its_first_cleaning() -> None:
    retention_ms = 10_000
    # The tombstone's own timestamp is ancient: it does not shorten its life.
    log = [data(0, (b"k", b"v"), (b"j", b"w")), data(2, (b"k", None), ts_ms=5)]
    first = run_pass(log, now_ms=NOW_MS, delete_retention_ms=retention_ms)
    assert survivors(first.log) == [(1, b"j", b"w"), (2, b"k", None)]
    assert first.cleaner.next_removal_ms == NOW_MS + retention_ms
    state = initial_state(0).after_pass(
        clean_offset=3, clean_bytes=0, now_ms=NOW_MS, delete_retention_ms=retention_ms,
        next_removal_ms=first.cleaner.next_removal_ms,
    )
    early = run_pass(first.log, state=state, now_ms=NOW_MS + retention_ms - 1,
                     delete_retention_ms=retention_ms)
    assert survivors(early.log) == [(1, b"j", b"w"), (2, b"k", None)]
    due = run_pass(first.log, state=state, now_ms=NOW_MS + retention_ms,
                   delete_retention_ms=retention_ms)
    assert survivors(due.log) == [(1, b"j", b"w")]
    assert due.cleaner.stats.tombstones_removed == 1
    assert due.cleaner.next_removal_ms == NO_REMOVAL_MS


def test_a_tombstone_superseded_by_a_newer_value_goes_at_once() -> None:
    log = [data(0, (b"k", None)), data(1, (b"k", b"back"))]
    assert survivors(run_pass(log).log) == [(1, b"k", b"back")]


def test_aborted_records_go_and_never_count_as_newest() -> None:
    pid = 7
    log = [
        data(0, (b"k", b"committed")),
        data(1, (b"k", b"aborted"), (b"new", b"aborted"), pid=pid, txn=True),
        marker(3, codec.MARKER_ABORT, pid=pid),
        data(4, (b"other", b"x")),
    ]
    aborted = [AbortedTxn(pid, 1, 3, 4)]
    first = run_pass(log, aborted=aborted)
    assert survivors(first.log) == [(0, b"k", b"committed"), (4, b"other", b"x")]
    assert first.cleaner.stats.aborted_records_removed == 2
    # The marker stays until delete.retention.ms after it was first cleaned.
    assert actions(first) == {0: "keep", 1: "drop", 3: "keep", 4: "keep"}
    state = CompactionState(clean_offset=5, history=(CleanedUpTo(5, NOW_MS),))
    later = run_pass(first.log, state=state, now_ms=NOW_MS + DAY_MS, aborted=aborted)
    assert later.decisions[3].action is BatchAction.DROP
    assert later.decisions[3].drops_aborted_txn
    assert later.cleaner.stats.markers_removed == 1


def test_commit_marker_stays_while_a_record_of_its_transaction_survives() -> None:
    pid = 7
    log = [
        data(0, (b"k", b"in-txn"), pid=pid, txn=True),
        marker(1, codec.MARKER_COMMIT, pid=pid),
        data(2, (b"j", b"x")),
    ]
    kept = run_pass(log, state=CLEANED_LONG_AGO)
    assert actions(kept) == {0: "keep", 1: "keep", 2: "keep"}
    # Once the transaction's record is superseded, the marker may go too.
    superseded = [*log, data(3, (b"k", b"later"))]
    gone = run_pass(superseded, state=CLEANED_LONG_AGO)
    assert actions(gone) == {0: "drop", 1: "drop", 2: "keep", 3: "keep"}
    assert not gone.decisions[1].drops_aborted_txn
    assert gone.cleaner.stats.markers_removed == 1
    # Unless the producer is still active: its last batch, the marker, stays.
    active = run_pass(superseded, state=CLEANED_LONG_AGO, active=frozenset({pid}))
    assert actions(active) == {0: "drop", 1: "keep", 2: "keep", 3: "keep"}
    assert active.cleaner.stats.markers_removed == 0


def test_active_producer_keeps_its_last_batch_as_a_header() -> None:
    pid, other = 9, 10
    log = [
        data(0, (b"k", b"1"), pid=pid, epoch=3, seq=0),
        data(1, (b"k", b"2"), pid=pid, epoch=3, seq=1),
        data(2, (b"k", b"3"), pid=other, seq=0),
        data(3, (b"k", b"4")),
    ]
    result = run_pass(log, active=frozenset({pid}))
    # pid's last batch stays (emptied); its earlier one and the expired
    # producer's batch go.
    assert actions(result) == {0: "drop", 1: "rewrite", 2: "drop", 3: "keep"}
    emptied = codec.validate_batch(result.log[0].data, max_size_bytes=1 << 20, compacted=True)
    original = log[1].header
    assert emptied.record_count == 0
    assert (emptied.producer_id, emptied.producer_epoch, emptied.base_sequence,
            emptied.last_sequence, emptied.base_offset, emptied.next_offset) == (
        original.producer_id, original.producer_epoch, original.base_sequence,
        original.last_sequence, original.base_offset, original.next_offset)
    # An already emptied last batch is kept as it is on the next pass.
    again = run_pass(result.log, active=frozenset({pid}))
    assert again.decisions[1].action is BatchAction.KEEP


def test_a_version_1_producer_keeps_the_data_batch_that_holds_its_sequence() -> None:
    """Markers of the data's epoch (version 1) say nothing of the sequence:
    the producer's last data batch stays under them, emptied; a marker of a
    newer epoch (version 2, or a fence) restarts the sequence and lets it go."""
    pid = 5
    log = [
        data(0, (b"k", b"a"), pid=pid, epoch=2, seq=0, txn=True),
        data(1, (b"k", b"b"), pid=pid, epoch=2, seq=1, txn=True),
        marker(2, codec.MARKER_ABORT, pid=pid, epoch=2),
        marker(3, codec.MARKER_COMMIT, pid=pid, epoch=2),
        data(4, (b"k", b"c")),
    ]
    aborted = [AbortedTxn(pid, 0, 2, 3)]
    result = run_pass(log, state=CLEANED_LONG_AGO, aborted=aborted, active=frozenset({pid}))
    assert actions(result) == {0: "drop", 1: "rewrite", 2: "drop", 3: "keep", 4: "keep"}
    held = codec.read_header(result.log[0].data)
    assert (held.base_offset, held.producer_epoch, held.last_sequence, held.record_count) == (
        1, 2, 1, 0)
    # The emptied batch stays on the next pass.
    again = run_pass(result.log, state=CLEANED_LONG_AGO, active=frozenset({pid}))
    assert again.decisions[1].action is BatchAction.KEEP
    # A marker of a newer epoch restarts the sequence: the batch may go.
    bumped = [*log[:2], marker(2, codec.MARKER_ABORT, pid=pid, epoch=3),
              marker(3, codec.MARKER_COMMIT, pid=pid, epoch=3), log[4]]
    gone = run_pass(bumped, state=CLEANED_LONG_AGO, aborted=aborted, active=frozenset({pid}))
    assert actions(gone) == {0: "drop", 1: "drop", 2: "drop", 3: "keep", 4: "keep"}
    # Not in the producer table: nothing of it needs to stay.
    idle = run_pass(log, state=CLEANED_LONG_AGO, aborted=aborted)
    assert actions(idle) == {0: "drop", 1: "drop", 2: "drop", 3: "drop", 4: "keep"}


def test_offset_map_bound_ends_the_pass_below_the_batch_that_does_not_fit() -> None:
    log = [data(0, (b"a", b"1"), (b"b", b"1")), data(2, (b"c", b"1")), data(3, (b"a", b"2"))]
    builder = OffsetMapBuilder(aborted={}, max_keys=2)
    assert builder.add(log[0].header, tuple(codec.iter_record_keys(log[0].data)))
    assert not builder.add(log[1].header, tuple(codec.iter_record_keys(log[1].data)))
    assert builder.newest == {b"a": 0, b"b": 1}
    result = run_pass(log, max_keys=2)
    # The pass covered only the first batch: nothing after it was decided.
    assert set(result.decisions) == {0}
    # The first batch is always taken, even when it alone is over the bound.
    assert OffsetMapBuilder(aborted={}, max_keys=1).add(
        log[0].header, tuple(codec.iter_record_keys(log[0].data)))


def test_state_round_trips_and_rejects_damage() -> None:
    state = CompactionState(
        clean_offset=120, clean_bytes=4096,
        history=(CleanedUpTo(50, NOW_MS - 10), CleanedUpTo(120, NOW_MS)), next_removal_ms=NOW_MS,
    )
    encoded = encode_compaction_state(state)
    assert decode_compaction_state(encoded, what="t") == state
    assert decode_compaction_state(encode_compaction_state(initial_state(7)), what="t") == (
        CompactionState(clean_offset=7))
    with pytest.raises(CorruptValueError, match="CRC32C"):
        decode_compaction_state(encoded[:-1] + bytes([encoded[-1] ^ 1]), what="t")
    truncated = seal(COMPACTION_STATE_VERSION, unseal(encoded, version=1, what="t")[:-3])
    with pytest.raises(CorruptValueError, match="history"):
        decode_compaction_state(truncated, what="t")
    backwards = CompactionState(history=(CleanedUpTo(9, 1), CleanedUpTo(9, 2)))
    with pytest.raises(CorruptValueError, match="out of order"):
        decode_compaction_state(encode_compaction_state(backwards), what="t")


def test_history_gives_the_removal_horizon_and_stays_small() -> None:
    retention_ms = 32_000  # slices of 1 s
    state = initial_state(0)
    for i in range(1, 101):
        state = state.after_pass(clean_offset=i * 10, clean_bytes=0, now_ms=i * 500,
                                 delete_retention_ms=retention_ms, next_removal_ms=NO_REMOVAL_MS)
    # Two passes per slice share an entry; entries older than the retention
    # collapse to the newest of them.
    assert len(state.history) <= HISTORY_SLICES + 2
    times = [e.cleaned_at_ms for e in state.history]
    assert times == sorted(times)
    now_ms = 100 * 500
    horizon = state.removal_horizon(now_ms, retention_ms)
    # Everything cleaned by now - retention is below the horizon, nothing later.
    assert horizon == max(e.clean_offset for e in state.history
                          if now_ms - e.cleaned_at_ms >= retention_ms)
    # Exactly: passes up to now - retention = 18 000 ms (i = 36) cleaned
    # below 360. Sharing an entry per 1 s slice may hold tombstones back by
    # up to one slice (two passes here), never release them early.
    assert 360 - 20 <= horizon <= 360
    assert state.entered_cleaned_part_ms(horizon, now_ms) > now_ms - retention_ms
    assert state.entered_cleaned_part_ms(10_000, now_ms) == now_ms


def test_history_merges_when_retention_grows() -> None:
    state = CompactionState(history=tuple(CleanedUpTo(i + 1, i * 1000) for i in range(200)),
                            clean_offset=200)
    grown = state.after_pass(clean_offset=201, clean_bytes=0, now_ms=200_000,
                             delete_retention_ms=10 * DAY_MS, next_removal_ms=NO_REMOVAL_MS)
    assert len(grown.history) == 2 * HISTORY_SLICES
    assert grown.history[-1] == CleanedUpTo(201, 200_000)


def test_retention_moves_the_clean_offset() -> None:
    state = CompactionState(clean_offset=100, clean_bytes=1000,
                            history=(CleanedUpTo(40, 1), CleanedUpTo(100, 2)))
    inside = state.after_retention(50, 300)
    assert (inside.clean_offset, inside.clean_bytes, inside.history) == (
        100, 700, (CleanedUpTo(100, 2),))
    # The count only steers the dirty ratio: never below zero.
    assert state.after_retention(50, 5000).clean_bytes == 0
    past = state.after_retention(150, 1200)
    assert (past.clean_offset, past.clean_bytes, past.history) == (150, 0, ())


def test_compaction_due() -> None:
    state = CompactionState(clean_offset=10, clean_bytes=600)

    def due(*, state: CompactionState = state, size_bytes: int = 1000,
            first_uncleanable_offset: int = 20, min_cleanable_dirty_ratio: float = 0.4,
            now_ms: int = NOW_MS) -> bool:
        return compaction_due(
            state, size_bytes=size_bytes, first_uncleanable_offset=first_uncleanable_offset,
            min_cleanable_dirty_ratio=min_cleanable_dirty_ratio, now_ms=now_ms,
        )

    assert due()                                   # 400 dirty of 1000 >= 0.4
    assert not due(min_cleanable_dirty_ratio=0.5)
    assert not due(first_uncleanable_offset=10)    # nothing new below the bound
    waiting = CompactionState(clean_offset=10, clean_bytes=1000, next_removal_ms=NOW_MS)
    assert due(state=waiting, first_uncleanable_offset=10)
    assert not due(state=waiting, now_ms=NOW_MS - 1, first_uncleanable_offset=10)
