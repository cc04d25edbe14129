"""The append rules of DESIGN.md §3, on the pure producer-state core.

Goal: every row of the rules table gives the documented outcome, and deciding
on a batch never changes the state (only `replay` does).

Method: a table. Each row replays a history of batches (at consecutive
offsets from 0) into a fresh ProducerStateManager, then checks one more
batch and compares the decision (append, duplicate with the original
offset, or the rejection's error code). Headers come from the real codec
(encode_batch/read_header), so sequences and wrap-around are computed the
way the store sees them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from oncelog.errors import ErrorCode
from oncelog.records import (
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
    Append,
    Duplicate,
    ProducerStateManager,
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


# Six batches of two records: sequences 0-1, 2-3, ..., 10-11 at offsets 0, 2, ..., 10.
SIX = _seqs(0, 2, 6)
APPEND = "append"


def dup(offset: int) -> tuple[str, int]:
    return ("duplicate", offset)


ROWS: list[tuple[str, list[B], B, object]] = [
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
    # -- transactions are not available in this version
    ("transactional batch of a new producer", [], B(seq=0, txn=True),
     ErrorCode.INVALID_TXN_STATE),
    ("transactional batch in sequence", [B(seq=0)], B(seq=1, txn=True),
     ErrorCode.INVALID_TXN_STATE),
]


def _history(batches: list[B]) -> ProducerStateManager:
    state = ProducerStateManager(TP)
    offset = 0
    for batch in batches:
        header = dataclasses.replace(batch.header(), base_offset=offset)
        state.replay(header, offset, append_time_ms=5_000)
        offset = header.next_offset
    return state


@pytest.mark.parametrize(("history", "batch", "expected"),
                         [(r[1], r[2], r[3]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_append_rules(history: list[B], batch: B, expected: object) -> None:
    state = _history(history)
    before = state.as_mapping()
    decision = state.check_append(batch.header())
    if expected == APPEND:
        assert isinstance(decision, Append), decision
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
