"""The append and marker rules of DESIGN.md §3-§4 (transaction versions 2
and 1), on the pure producer-state core.

Goal: every row of the rules tables gives the documented outcome — data
batches (idempotence, epochs, open transactions, the verification step) and
COMMIT/ABORT markers (version 2: strictly higher epoch; version 1: the same
epoch or above, told apart by the decision's timestamp; identical retry,
zombie coordinator, delayed marker, no prior state) — deciding never changes
the state (only `replay` does), and the LSO input (first unstable offset)
follows open transactions and markers. Version-1 producers keep their epoch
and their sequences across transactions, so the append rows also walk a
version-1 producer's next transaction after a marker of its epoch; and a
coordinator's conditional append is checked without the sequence rules.

Method: tables. Each row replays a history of batches and markers (at
consecutive offsets from 0) into a fresh ProducerStateManager, then checks one
more batch or marker and compares the decision (append, needs verification,
duplicate with the original offset, write, or the rejection's error code).
Headers come from the real codec (encode_batch / encode_control_batch /
read_header), so sequences and wrap-around are computed the way the store
sees them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from oncelog.errors import ErrorCode
from oncelog.records import (
    MARKER_ABORT,
    MARKER_COMMIT,
    MAX_SEQUENCE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    encode_batch,
    encode_control_batch,
    read_header,
)
from services.partition_store.core.outcomes import Rejection
from services.partition_store.core.producer_state import (
    CACHED_BATCHES,
    NO_OFFSET,
    Append,
    CompletedTxn,
    Duplicate,
    DuplicateMarker,
    MarkerMetadata,
    NeedsVerification,
    ProducerStateManager,
    TxnMarker,
    WriteMarker,
)

PID = 1000
TP = "orders-3"


@dataclass(frozen=True)
class B:
    """A batch in a row: producer id, epoch, base sequence, record count."""

    pid: int = PID
    epoch: int = 0
    seq: int = 0
    count: int = 1
    txn: bool = False
    # Checked as if the coordinator had confirmed the transaction.
    verified: bool = False
    # A coordinator's conditional append (no sequence rules).
    coordinator: bool = False

    def header(self) -> BatchHeader:
        """The header of a real encoded one-record batch, with the record
        count set afterwards: the core reads only header fields, and wrap-around
        rows need batches of up to 2^31 records."""
        records = [(None, b"v", None, 1_000)]
        if self.pid == NO_PRODUCER_ID:
            raw = encode_batch(records)
        else:
            raw = encode_batch(
                records, producer_id=self.pid, producer_epoch=self.epoch,
                base_sequence=self.seq, transactional=self.txn,
            )
        return dataclasses.replace(
            read_header(raw), record_count=self.count, last_offset_delta=self.count - 1
        )


def _seqs(first: int, count: int, n: int) -> list[B]:
    """n consecutive batches of `count` records starting at sequence `first`."""
    return [B(seq=(first + i * count) % (MAX_SEQUENCE + 1), count=count) for i in range(n)]


@dataclass(frozen=True)
class M:
    """A marker in a history or a row: epoch, type, coordinator epoch; the
    transaction version and (version 1) the decision's timestamp, which the
    store writes as the control batch's."""

    epoch: int
    type: int = MARKER_COMMIT
    coord: int = 0
    pid: int = PID
    version: int = 2
    ts: int = 2_000

    def marker(self) -> TxnMarker:
        return TxnMarker(self.pid, self.epoch, self.type, self.coord,
                         transaction_version=self.version,
                         timestamp_ms=self.ts if self.version == 1 else -1)

    def header(self) -> BatchHeader:
        return read_header(encode_control_batch(
            marker=self.type, coordinator_epoch=self.coord, producer_id=self.pid,
            producer_epoch=self.epoch, timestamp_ms=self.ts,
        ))


def v1(epoch: int, ts: int, **kwargs: int) -> M:
    """A version-1 marker decided at `ts`."""
    return M(epoch=epoch, version=1, ts=ts, **kwargs)


# Six batches of two records: sequences 0-1, 2-3, ..., 10-11 at offsets 0, 2, ..., 10.
SIX = _seqs(0, 2, 6)
APPEND = "append"
VERIFY = "verify"
WRITE = "write"


def dup(offset: int) -> tuple[str, int]:
    return ("duplicate", offset)


ROWS: list[tuple[str, Sequence[B | M], B, object]] = [
    # -- no producer id: not idempotent
    ("non-idempotent batch appends", [], B(pid=NO_PRODUCER_ID), APPEND),
    ("non-idempotent batch repeated still appends", [B(pid=NO_PRODUCER_ID)],
     B(pid=NO_PRODUCER_ID), APPEND),
    # -- unknown producer
    ("unknown producer at sequence 0 appends", [], B(seq=0), APPEND),
    ("unknown producer at sequence 5 is out of order", [], B(seq=5),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    # -- same epoch, in sequence
    ("next sequence appends", [B(seq=0, count=3)], B(seq=3), APPEND),
    ("gap is out of order", [B(seq=0, count=3)], B(seq=4),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("sequence going back is out of order", [B(seq=0, count=3), B(seq=3)], B(seq=2),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    # -- duplicates of each of the last five batches (the oldest of six fell out)
    ("duplicate of the newest batch", SIX, B(seq=10, count=2), dup(10)),
    ("duplicate of the 2nd newest batch", SIX, B(seq=8, count=2), dup(8)),
    ("duplicate of the 3rd newest batch", SIX, B(seq=6, count=2), dup(6)),
    ("duplicate of the 4th newest batch", SIX, B(seq=4, count=2), dup(4)),
    ("duplicate of the 5th newest batch", SIX, B(seq=2, count=2), dup(2)),
    ("duplicate older than the last five is out of order", SIX, B(seq=0, count=2),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("same first sequence, other last sequence is not a duplicate", SIX, B(seq=8, count=1),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    # -- epochs
    ("epoch below current is fenced", [B(epoch=3)], B(epoch=2, seq=1),
     ErrorCode.INVALID_PRODUCER_EPOCH),
    ("epoch below current, transactional: PRODUCER_FENCED", [B(epoch=3)],
     B(epoch=2, seq=1, txn=True), ErrorCode.PRODUCER_FENCED),
    ("retry of an old-epoch batch after a bump is fenced", [B(epoch=0), B(epoch=1)],
     B(epoch=0, seq=0), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("epoch above with sequence 0 appends", [B(epoch=0, seq=0, count=4)], B(epoch=1, seq=0),
     APPEND),
    ("epoch above with sequence 4 is out of order", [B(epoch=0, seq=0, count=4)],
     B(epoch=1, seq=4), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("after a bump the new epoch's batch dedups", [B(epoch=0, count=4), B(epoch=1, seq=0)],
     B(epoch=1, seq=0), dup(4)),
    ("after a bump old-epoch sequences do not dedup", [B(epoch=0, count=4), B(epoch=1)],
     B(epoch=1, seq=1), APPEND),
    # -- wrap-around at 2^31 (histories are replayed unchecked, so they may start anywhere)
    ("wrap: MAX_SEQUENCE follows MAX_SEQUENCE - 1", [B(seq=MAX_SEQUENCE - 1)],
     B(seq=MAX_SEQUENCE), APPEND),
    ("wrap: after MAX_SEQUENCE comes 0", [B(seq=MAX_SEQUENCE - 1, count=2)], B(seq=0), APPEND),
    ("wrap: MAX_SEQUENCE + 1 is not a sequence", [B(seq=MAX_SEQUENCE - 1, count=2)],
     B(seq=5), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    # MAX_SEQUENCE - 1, MAX_SEQUENCE, 0: the next batch starts at 1.
    ("wrap: next batch after one spanning the wrap", [B(seq=MAX_SEQUENCE - 1, count=3)],
     B(seq=1), APPEND),
    ("wrap: sequence 2 after a batch ending at 0 is out of order",
     [B(seq=MAX_SEQUENCE - 1, count=3)], B(seq=2), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("wrap: duplicate of a batch spanning the wrap", [B(seq=MAX_SEQUENCE - 1, count=3)],
     B(seq=MAX_SEQUENCE - 1, count=3), dup(0)),
    ("wrap: a batch ending at MAX_SEQUENCE, then sequence 0 again",
     [B(seq=5), B(seq=6, count=MAX_SEQUENCE - 5)], B(seq=0), APPEND),
    # -- transactions: opening one needs the coordinator's verification
    ("transactional batch of a new producer needs verification", [], B(seq=0, txn=True),
     VERIFY),
    ("... and appends once verified", [], B(seq=0, txn=True, verified=True), APPEND),
    ("transactional batch after idempotent ones needs verification", [B(seq=0)],
     B(seq=1, txn=True), VERIFY),
    ("out-of-order transactional batch is refused before any verification", [],
     B(seq=3, txn=True), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("stale-epoch transactional batch is fenced before any verification", [B(epoch=2)],
     B(epoch=1, seq=0, txn=True), ErrorCode.PRODUCER_FENCED),
    ("next batch of an open transaction appends without verification",
     [B(seq=0, txn=True)], B(seq=1, txn=True), APPEND),
    ("retry of an open transaction's batch is a duplicate",
     [B(seq=0, count=2, txn=True)], B(seq=0, count=2, txn=True), dup(0)),
    ("non-transactional batch during an open transaction",
     [B(seq=0, txn=True)], B(seq=1), ErrorCode.INVALID_TXN_STATE),
    ("non-transactional batch of a new epoch during an open transaction",
     [B(seq=0, txn=True)], B(epoch=1, seq=0), ErrorCode.INVALID_TXN_STATE),
    # The producer's next transaction, before the previous one's marker: the
    # coordinator answers once the markers have landed, so ask it first ...
    ("transactional batch of a higher epoch while the old transaction is open asks first",
     [B(seq=0, txn=True)], B(epoch=1, seq=0, txn=True), VERIFY),
    ("... a bad sequence is refused without asking",
     [B(seq=0, txn=True)], B(epoch=1, seq=2, txn=True),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    # ... and confirmed with no marker, the old one is hanging: refused.
    ("transactional batch of a higher epoch while the old transaction is open, verified",
     [B(seq=0, txn=True)], B(epoch=1, seq=0, txn=True, verified=True),
     ErrorCode.INVALID_TXN_STATE),
    ("after a marker: the next transaction starts at sequence 0 of the marker's epoch",
     [B(seq=0, count=3, txn=True), M(epoch=1)], B(epoch=1, seq=0, txn=True), VERIFY),
    ("after a marker: sequence 3 of the marker's epoch is out of order",
     [B(seq=0, count=3, txn=True), M(epoch=1)], B(epoch=1, seq=3, txn=True),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("after a marker: the old epoch is fenced",
     [B(seq=0, txn=True), M(epoch=1)], B(epoch=0, seq=1, txn=True),
     ErrorCode.PRODUCER_FENCED),
    ("after a marker: a non-transactional batch of the marker's epoch appends",
     [B(seq=0, txn=True), M(epoch=1)], B(epoch=1, seq=0), APPEND),
    ("a marker for a producer never seen here creates its entry",
     [M(epoch=4)], B(epoch=4, seq=0, txn=True), VERIFY),
    # -- version 1: the next transaction keeps the epoch and the sequences
    ("v1: after a marker of its epoch, the next transaction goes on at the next sequence "
     "and is verified first", [B(seq=0, count=2, txn=True), v1(0, 100)],
     B(seq=2, txn=True), VERIFY),
    ("v1: ... and verified, appends", [B(seq=0, count=2, txn=True), v1(0, 100)],
     B(seq=2, txn=True, verified=True), APPEND),
    ("v1: restarting the sequence at 0 at the same epoch is out of order",
     [B(seq=0, count=2, txn=True), v1(0, 100)], B(seq=0, txn=True),
     ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("v1: a late retry of the last transaction's batch after its marker is a duplicate",
     [B(seq=0, count=2, txn=True), v1(0, 100)], B(seq=0, count=2, txn=True), dup(0)),
    ("v1: after a fence marker (epoch bumped by the coordinator), the old epoch is fenced",
     [B(seq=0, count=2, txn=True), v1(1, 100)], B(seq=2, txn=True),
     ErrorCode.PRODUCER_FENCED),
    # -- a coordinator's conditional append: no sequence rules, the rest holds
    ("coordinator: a sequence reused after a marker of its epoch is no duplicate",
     [B(seq=0, txn=True), v1(0, 100)], B(seq=0, txn=True, verified=True, coordinator=True),
     APPEND),
    ("coordinator: out of sequence appends", [B(seq=0, count=3)], B(seq=7, coordinator=True),
     APPEND),
    ("coordinator: a new epoch at any sequence appends", [B(seq=0, count=3)],
     B(epoch=1, seq=7, coordinator=True), APPEND),
    ("coordinator: an older epoch is still fenced", [B(epoch=2, seq=0)],
     B(epoch=1, seq=5, txn=True, coordinator=True), ErrorCode.PRODUCER_FENCED),
    ("coordinator: opening a transaction is still verified", [],
     B(seq=4, txn=True, coordinator=True), VERIFY),
]


def _history(steps: Sequence[B | M]) -> ProducerStateManager:
    state = ProducerStateManager(TP)
    offset = 0
    for step in steps:
        header = dataclasses.replace(step.header(), base_offset=offset)
        control = (step.type, step.coord) if isinstance(step, M) else None
        state.replay(header, offset, append_time_ms=5_000, control=control)
        offset = header.next_offset
    return state


@pytest.mark.parametrize(("history", "batch", "expected"),
                         [(r[1], r[2], r[3]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_append_rules(history: Sequence[B | M], batch: B, expected: object) -> None:
    state = _history(history)
    before = state.as_mapping()
    decision = state.check_append(batch.header(), txn_verified=batch.verified,
                                  sequenced=not batch.coordinator)
    if expected == APPEND:
        assert isinstance(decision, Append), decision
    elif expected == VERIFY:
        assert isinstance(decision, NeedsVerification), decision
    elif isinstance(expected, tuple):
        assert isinstance(decision, Duplicate), decision
        assert decision.base_offset == expected[1]
        assert decision.record_count == batch.count
    else:
        assert isinstance(decision, Rejection), decision
        assert decision.code == expected
        assert TP in decision.message
        if batch.pid != NO_PRODUCER_ID:
            assert str(batch.pid) in decision.message
    # Deciding never changes the state, whatever the decision was.
    assert state.as_mapping() == before


def test_out_of_order_message_names_expected_and_received() -> None:
    state = _history([B(seq=0, count=3)])
    decision = state.check_append(B(seq=7).header())
    assert isinstance(decision, Rejection)
    assert "expected sequence 3" in decision.message
    assert "received 7" in decision.message
    assert f"producer {PID}" in decision.message
    assert TP in decision.message


def test_control_batch_is_refused() -> None:
    header = read_header(encode_control_batch(
        marker=MARKER_COMMIT, coordinator_epoch=0, producer_id=PID, producer_epoch=1,
        timestamp_ms=1,
    ))
    decision = ProducerStateManager(TP).check_append(header)
    assert isinstance(decision, Rejection)
    assert decision.code == ErrorCode.INVALID_RECORD


def test_validation_does_not_mutate() -> None:
    """Rejected and accepted-but-not-replayed checks leave the table as it was;
    replay is what changes it."""
    state = _history(SIX)
    before = state.as_mapping()
    rejected = state.check_append(B(seq=99).header())
    assert isinstance(rejected, Rejection)
    assert state.as_mapping() == before
    accepted = state.check_append(B(seq=12).header())
    assert isinstance(accepted, Append)
    assert state.as_mapping() == before
    bump = state.check_append(B(epoch=1, seq=0).header())
    assert isinstance(bump, Append)
    assert state.as_mapping() == before
    header = dataclasses.replace(B(seq=12).header(), base_offset=12)
    state.replay(header, 12, append_time_ms=6_000)
    assert state.as_mapping() != before
    entry = state.get(PID)
    assert entry is not None and entry.last_sequence == 12


def test_replay_keeps_last_five_and_epoch_bump_clears_them() -> None:
    state = _history(SIX)
    entry = state.get(PID)
    assert entry is not None
    assert len(entry.batches) == CACHED_BATCHES
    assert [b.first_sequence for b in entry.batches] == [2, 4, 6, 8, 10]
    assert [b.base_offset for b in entry.batches] == [2, 4, 6, 8, 10]
    state.replay(dataclasses.replace(B(epoch=1).header(), base_offset=12), 12, 7_000)
    entry = state.get(PID)
    assert entry is not None
    assert entry.producer_epoch == 1
    assert [b.first_sequence for b in entry.batches] == [0]
    assert entry.last_append_time_ms == 7_000


def test_non_idempotent_batches_leave_no_state() -> None:
    state = _history([B(pid=NO_PRODUCER_ID), B(pid=NO_PRODUCER_ID)])
    assert len(state) == 0
    assert B(pid=NO_PRODUCER_ID).header().producer_epoch == NO_PRODUCER_EPOCH
    assert B(pid=NO_PRODUCER_ID).header().base_sequence == NO_SEQUENCE


def test_transactional_replay_records_first_offset_of_open_transaction() -> None:
    # Reachable only once transactions land, but replay must already keep it.
    state = ProducerStateManager(TP)
    state.replay(dataclasses.replace(B(txn=True).header(), base_offset=40), 40, 1)
    state.replay(dataclasses.replace(B(seq=1, txn=True).header(), base_offset=41), 41, 2)
    entry = state.get(PID)
    assert entry is not None and entry.current_txn_first_offset == 40


def test_expiry_by_store_clock_spares_open_transactions() -> None:
    state = ProducerStateManager(TP)
    state.replay(dataclasses.replace(B(pid=1).header(), base_offset=0), 0, 1_000)
    state.replay(dataclasses.replace(B(pid=2).header(), base_offset=1), 1, 5_000)
    state.replay(dataclasses.replace(B(pid=3, txn=True).header(), base_offset=2), 2, 1_000)
    assert state.remove_expired(now_ms=10_999, expiration_ms=10_000) == []
    assert state.remove_expired(now_ms=11_000, expiration_ms=10_000) == [1]
    assert sorted(e.producer_id for e in state.entries()) == [2, 3]
    # An expired producer is unknown again: it must restart at sequence 0.
    decision = state.check_append(B(pid=1, seq=1).header())
    assert isinstance(decision, Rejection)
    assert decision.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# ------------------------------------------------------------------ markers

TXN = B(seq=0, count=2, txn=True)        # a transaction's batch at offsets 0-1
NEXT_TXN = B(epoch=1, seq=0, txn=True)   # the next transaction, after a marker at epoch 1
# Version 1: the next transaction at the same epoch, its sequence going on (offset 3).
V1_NEXT_TXN = B(epoch=0, seq=2, txn=True, verified=True)

MARKER_ROWS: list[tuple[str, Sequence[B | M], M, object]] = [
    ("no state for the producer: written", [], M(epoch=0), WRITE),
    ("idempotent-only producer: written", [B(seq=0)], M(epoch=1), WRITE),
    ("epoch strictly above the open transaction's: written", [TXN], M(epoch=1), WRITE),
    ("epoch far above: written", [TXN], M(epoch=7), WRITE),
    ("epoch equal to the producer's: refused", [TXN], M(epoch=0),
     ErrorCode.INVALID_PRODUCER_EPOCH),
    ("identical retry of the last marker: no-op with its offset", [TXN, M(epoch=1)],
     M(epoch=1), ("duplicate", 2)),
    ("identical retry with a higher coordinator epoch (failover): no-op",
     [TXN, M(epoch=1, coord=3)], M(epoch=1, coord=4), ("duplicate", 2)),
    ("identical retry after the next transaction began: no-op, it stays open",
     [TXN, M(epoch=1), NEXT_TXN], M(epoch=1), ("duplicate", 2)),
    ("same epoch, other type than the last marker: refused", [TXN, M(epoch=1)],
     M(epoch=1, type=MARKER_ABORT), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("delayed ABORT of the earlier transaction while the next is open: refused",
     [TXN, M(epoch=1), NEXT_TXN], M(epoch=1, type=MARKER_ABORT),
     ErrorCode.INVALID_PRODUCER_EPOCH),
    ("delayed marker of an earlier transaction after a later one ended: refused",
     [TXN, M(epoch=1), NEXT_TXN, M(epoch=2)], M(epoch=1), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("marker of the next transaction: written", [TXN, M(epoch=1), NEXT_TXN], M(epoch=2),
     WRITE),
    ("lower coordinator epoch: zombie coordinator", [TXN, M(epoch=1, coord=5), NEXT_TXN],
     M(epoch=2, coord=4), ErrorCode.TRANSACTION_COORDINATOR_FENCED),
    ("lower coordinator epoch, even for an identical retry", [TXN, M(epoch=1, coord=5)],
     M(epoch=1, coord=4), ErrorCode.TRANSACTION_COORDINATOR_FENCED),
    ("higher coordinator epoch (new coordinator): written",
     [TXN, M(epoch=1, coord=5), NEXT_TXN], M(epoch=2, coord=6), WRITE),
    ("unknown marker type", [TXN], M(epoch=1, type=7), ErrorCode.INVALID_REQUEST),
    ("negative producer epoch", [], M(epoch=-1), ErrorCode.INVALID_REQUEST),
    ("producer epoch beyond int16", [], M(epoch=2**15), ErrorCode.INVALID_REQUEST),
    ("no producer id", [], M(epoch=1, pid=-1), ErrorCode.INVALID_REQUEST),
    ("unknown transaction version", [TXN], M(epoch=1, version=3), ErrorCode.INVALID_REQUEST),
    # -- version 1: the data's epoch (or above), ordered by the decision's timestamp
    ("v1: no state for the producer: written", [], v1(0, 100), WRITE),
    ("v1: the data's epoch (equal): written", [TXN], v1(0, 100), WRITE),
    ("v1: above the data's epoch (a fence): written", [TXN], v1(1, 100), WRITE),
    ("v1: below the producer's epoch: refused", [B(epoch=2, seq=0, txn=True)], v1(1, 100),
     ErrorCode.INVALID_PRODUCER_EPOCH),
    ("v1: a marker of the fenced epoch after the fence's: refused", [TXN, v1(1, 100)],
     v1(0, 200), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("v1: identical retry of the last marker: no-op with its offset", [TXN, v1(0, 100)],
     v1(0, 100), dup(2)),
    ("v1: the next transaction's marker, same epoch and type, later: written",
     [TXN, v1(0, 100), V1_NEXT_TXN], v1(0, 200), WRITE),
    ("v1: the next transaction's ABORT, same epoch, later: written",
     [TXN, v1(0, 100), V1_NEXT_TXN], v1(0, 200, type=MARKER_ABORT), WRITE),
    ("v1: the next transaction's marker where it wrote nothing: written",
     [TXN, v1(0, 100)], v1(0, 200), WRITE),
    ("v1: a delayed copy of the last marker while the next transaction is open: no-op, "
     "it stays open", [TXN, v1(0, 100), V1_NEXT_TXN], v1(0, 100), dup(2)),
    ("v1: a delayed marker of an earlier transaction (older timestamp): refused",
     [TXN, v1(0, 100), V1_NEXT_TXN, v1(0, 200), B(seq=3, txn=True)], v1(0, 100),
     ErrorCode.INVALID_PRODUCER_EPOCH),
    ("v1: ... of the other type: refused",
     [TXN, v1(0, 100), V1_NEXT_TXN, v1(0, 200), B(seq=3, txn=True)],
     v1(0, 100, type=MARKER_ABORT), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("v1: the other outcome with the last marker's timestamp: refused", [TXN, v1(0, 100)],
     v1(0, 100, type=MARKER_ABORT), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("v1: lower coordinator epoch: zombie coordinator",
     [TXN, v1(0, 100, coord=5), V1_NEXT_TXN], v1(0, 200, coord=4),
     ErrorCode.TRANSACTION_COORDINATOR_FENCED),
    ("v1: no timestamp", [TXN], M(epoch=0, version=1, ts=0), ErrorCode.INVALID_REQUEST),
    ("v2 rule for the same history: the data's epoch is refused", [TXN, v1(0, 100),
     V1_NEXT_TXN], M(epoch=0, type=MARKER_ABORT), ErrorCode.INVALID_PRODUCER_EPOCH),
]


@pytest.mark.parametrize(("history", "marker", "expected"),
                         [(r[1], r[2], r[3]) for r in MARKER_ROWS],
                         ids=[r[0] for r in MARKER_ROWS])
def test_marker_rules(history: Sequence[B | M], marker: M, expected: object) -> None:
    state = _history(history)
    before = state.as_mapping()
    unstable_before = state.first_unstable_offset
    decision = state.check_marker(marker.marker())
    if expected == WRITE:
        assert isinstance(decision, WriteMarker), decision
    elif isinstance(expected, tuple):
        assert isinstance(decision, DuplicateMarker), decision
        assert decision.offset == expected[1]
    else:
        assert isinstance(decision, Rejection), decision
        assert decision.code == expected
        assert TP in decision.message
        assert str(marker.pid) in decision.message
    # Deciding on a marker never changes the state, whatever the decision was.
    assert state.as_mapping() == before
    assert state.first_unstable_offset == unstable_before


def test_zombie_and_delayed_marker_messages_name_the_values() -> None:
    state = _history([TXN, M(epoch=1, coord=5), NEXT_TXN])
    zombie = state.check_marker(M(epoch=2, coord=4).marker())
    assert isinstance(zombie, Rejection)
    assert "coordinator epoch 4 is below 5" in zombie.message
    delayed = state.check_marker(M(epoch=1, type=MARKER_ABORT, coord=5).marker())
    assert isinstance(delayed, Rejection)
    assert "expected > 1, received 1" in delayed.message


def test_transactional_append_opens_a_transaction_at_its_first_offset() -> None:
    state = ProducerStateManager(TP)
    assert state.first_unstable_offset is None
    state.replay(dataclasses.replace(B(txn=True).header(), base_offset=40), 40, 1_000)
    state.replay(dataclasses.replace(B(seq=1, txn=True).header(), base_offset=41), 41, 2_000)
    entry = state.get(PID)
    assert entry is not None
    assert entry.current_txn_first_offset == 40
    assert entry.current_txn_start_time_ms == 1_000
    assert state.first_unstable_offset == 40
    assert state.open_txn_count == 1
    assert state.oldest_open_txn_start_ms() == 1_000


@pytest.mark.parametrize("marker_type", [MARKER_COMMIT, MARKER_ABORT])
def test_marker_replay_ends_the_transaction(marker_type: int) -> None:
    state = _history([B(seq=0, count=2, txn=True), B(seq=2, txn=True)])  # offsets 0-1, 2
    completed = state.replay(
        dataclasses.replace(M(epoch=1, type=marker_type, coord=3).header(), base_offset=3),
        3, 9_000, control=(marker_type, 3),
    )
    assert completed == CompletedTxn(
        producer_id=PID, first_offset=0, last_offset=3, aborted=marker_type == MARKER_ABORT,
        last_stable_offset=4,
    )
    entry = state.get(PID)
    assert entry is not None
    assert entry.producer_epoch == 1
    assert entry.batches == ()            # the new epoch restarts its sequences at 0
    assert entry.current_txn_first_offset == NO_OFFSET
    assert entry.coordinator_epoch == 3
    assert entry.last_marker == MarkerMetadata(1, marker_type, 3, 2_000)
    assert entry.last_append_time_ms == 9_000
    # Ended, but the marker is not durable yet: the transaction still holds the LSO.
    assert state.open_txn_count == 0
    assert state.first_unstable_offset == 0
    state.on_high_watermark(3)
    assert state.first_unstable_offset == 0
    state.on_high_watermark(4)
    assert state.first_unstable_offset is None



def test_a_table_from_a_snapshot_keeps_ended_transactions_holding_the_lso() -> None:
    """A snapshot taken while a marker was above the HW: the table rebuilt
    from it (a restart, whose HW starts at the log start) still holds the
    LSO at the transaction's first offset until the HW passes the marker,
    as the table that took the snapshot did."""
    state = _history([B(seq=0, count=2, txn=True), B(seq=2, txn=True)])  # offsets 0-1, 2
    state.replay(dataclasses.replace(M(epoch=1, coord=3).header(), base_offset=3),
                 3, 9_000, control=(MARKER_COMMIT, 3))
    state.on_high_watermark(3)
    assert state.unreplicated() == ((3, 0),)
    rebuilt = ProducerStateManager(TP, state.entries(), state.unreplicated())
    assert rebuilt.open_txn_count == 0
    assert rebuilt.first_unstable_offset == 0
    rebuilt.on_high_watermark(3)
    assert rebuilt.first_unstable_offset == 0
    rebuilt.on_high_watermark(4)
    assert rebuilt.first_unstable_offset is None and rebuilt.unreplicated() == ()

def test_version_1_marker_keeps_the_epoch_the_batches_and_its_timestamp() -> None:
    """A version-1 marker at the data's epoch ends the transaction but leaves
    the producer's epoch and cached batches (its sequences go on); its
    decision's timestamp is read back from the control batch, as recovery
    and a follower replay it, and orders the next marker of the epoch."""
    state = _history([B(seq=0, count=2, txn=True), B(seq=2, txn=True)])  # offsets 0-1, 2
    decision = state.check_marker(v1(0, 1_234).marker())
    assert isinstance(decision, WriteMarker), decision
    completed = state.replay(
        dataclasses.replace(v1(0, 1_234).header(), base_offset=3), 3, 9_000,
        control=(MARKER_COMMIT, 0),
    )
    assert completed is not None and not completed.aborted
    entry = state.get(PID)
    assert entry is not None
    assert entry.producer_epoch == 0
    assert [(b.first_sequence, b.last_sequence) for b in entry.batches] == [(0, 1), (2, 2)]
    assert entry.last_marker == MarkerMetadata(0, MARKER_COMMIT, 3, 1_234)
    stale = state.check_marker(v1(0, 1_000, type=MARKER_ABORT).marker())
    assert isinstance(stale, Rejection)
    assert "decided at 1234" in stale.message and "received 1000" in stale.message


def test_marker_without_open_transaction_ends_nothing() -> None:
    state = ProducerStateManager(TP)
    completed = state.replay(
        dataclasses.replace(M(epoch=2, type=MARKER_ABORT).header(), base_offset=0), 0, 1,
        control=(MARKER_ABORT, 0),
    )
    assert completed is None
    entry = state.get(PID)
    assert entry is not None and entry.producer_epoch == 2 and not entry.has_open_txn
    assert state.first_unstable_offset is None


def test_first_unstable_offset_with_several_open_transactions() -> None:
    """Three producers open transactions at 0, 1 and 3 (a fourth writes
    idempotently at 2); markers end them out of order; the first unstable
    offset is always the oldest transaction still open or not durably ended."""
    state = ProducerStateManager(TP)

    def data(pid: int, offset: int, *, txn: bool = True, seq: int = 0) -> None:
        header = dataclasses.replace(B(pid=pid, seq=seq, txn=txn).header(), base_offset=offset)
        state.replay(header, offset, 1_000 + offset)

    def marker(pid: int, offset: int, marker_type: int) -> CompletedTxn | None:
        header = dataclasses.replace(
            M(pid=pid, epoch=1, type=marker_type).header(), base_offset=offset
        )
        return state.replay(header, offset, 1_000 + offset, control=(marker_type, 0))

    data(1, 0)
    data(2, 1)
    data(3, 2, txn=False)
    data(4, 3)
    data(1, 4, seq=1)
    assert state.first_unstable_offset == 0
    assert state.open_txn_count == 3
    # Producer 2 commits first: the oldest (producer 1, from 0) still holds.
    ended = marker(2, 5, MARKER_COMMIT)
    assert ended is not None and ended.last_stable_offset == 0
    state.on_high_watermark(6)
    assert state.first_unstable_offset == 0
    # Producer 1 aborts: the LSO after it is producer 4's first offset.
    ended = marker(1, 6, MARKER_ABORT)
    assert ended == CompletedTxn(1, 0, 6, True, 3)
    assert state.first_unstable_offset == 0      # marker not durable yet
    state.on_high_watermark(7)
    assert state.first_unstable_offset == 3
    ended = marker(4, 7, MARKER_ABORT)
    assert ended == CompletedTxn(4, 3, 7, True, 8)
    state.on_high_watermark(8)
    assert state.first_unstable_offset is None
    assert state.oldest_open_txn_start_ms() is None


def test_marker_validation_does_not_mutate() -> None:
    """Checking markers, written or refused, leaves the table and the
    unstable offsets as they were; replay is what changes them."""
    state = _history([TXN, M(epoch=1, coord=2), NEXT_TXN])
    state.on_high_watermark(4)  # the first transaction's marker (at 2) is durable
    before = state.as_mapping()
    for marker in (M(epoch=2, coord=2), M(epoch=1, coord=2), M(epoch=1, coord=1),
                   M(epoch=1, type=MARKER_ABORT), M(epoch=9, type=5)):
        state.check_marker(marker.marker())
        assert state.as_mapping() == before
        assert state.first_unstable_offset == 3
        assert state.open_txn_count == 1
    state.replay(dataclasses.replace(M(epoch=2, coord=2).header(), base_offset=4), 4, 1,
                 control=(MARKER_COMMIT, 2))
    assert state.as_mapping() != before
