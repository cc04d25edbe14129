"""The read_committed filter and the aborted-transaction index, as pure
functions.

Goal: given stored batch headers, the upper bound (LSO or HW) and the aborted
index, `select_batches` returns exactly the batches a reader may see — below
the bound, no markers, under read_committed no batch of an aborted
transaction — and a next_fetch_offset past everything returned and filtered
but never past the bound; `AbortedIndex.collect` finds every aborted
transaction overlapping a range although it stops early.

Method: logs are built by replaying batches and markers through the real
ProducerStateManager (as the partition does), which also yields the aborted
index entries and the first unstable offset. A table pins hand-written cases
(interleaved producers where one aborts and one commits; an open transaction
holding the LSO; budgets); a seed-driven check generates random interleavings
of transactional and idempotent producers, reads the whole log with a
consumer loop at random budgets, and compares what it saw with an oracle that
knows each batch's transaction outcome, and compares `collect` with a
brute-force scan. Seeds are fixed, so failures replay.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from oncelog.records import (
    MARKER_ABORT,
    MARKER_COMMIT,
    BatchHeader,
    encode_batch,
    encode_control_batch,
    read_header,
)
from services.common.kernel.invariants import InvariantViolation
from services.partition_store.core.fetch_filter import select_batches
from services.partition_store.core.log_state import last_stable_offset
from services.partition_store.core.producer_state import ProducerStateManager
from services.partition_store.core.txn_index import AbortedIndex, AbortedTxn

TP = "t-0"


@dataclass
class Log:
    """A partition's batches, built through the producer-state replay."""

    headers: list[BatchHeader] = field(default_factory=list)
    state: ProducerStateManager = field(default_factory=lambda: ProducerStateManager(TP))
    aborted: AbortedIndex = field(default_factory=lambda: AbortedIndex(TP))
    # For the oracle: base offset -> (producer id, transaction number or None).
    owner: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    outcome: dict[int, str] = field(default_factory=dict)   # txn number -> commit/abort
    _open: dict[int, int] = field(default_factory=dict)      # pid -> txn number
    _epoch: dict[int, int] = field(default_factory=dict)
    _seq: dict[int, int] = field(default_factory=dict)
    _txn_count: int = 0

    @property
    def end(self) -> int:
        return self.headers[-1].next_offset if self.headers else 0

    def data(self, pid: int, *, txn: bool, count: int = 1) -> int:
        epoch = self._epoch.get(pid, 0)
        seq = self._seq.get(pid, 0)
        raw = encode_batch(
            [(None, b"v", None, 1_000)] * count, producer_id=pid, producer_epoch=epoch,
            base_sequence=seq, transactional=txn,
        )
        header = dataclasses.replace(read_header(raw), base_offset=self.end)
        self._seq[pid] = seq + count
        number = None
        if txn:
            if pid not in self._open:
                self._open[pid] = self._txn_count
                self._txn_count += 1
            number = self._open[pid]
        self.owner[header.base_offset] = (pid, number)
        self._apply(header, None)
        return header.base_offset

    def marker(self, pid: int, marker_type: int) -> int:
        epoch = self._epoch.get(pid, 0) + 1
        raw = encode_control_batch(
            marker=marker_type, coordinator_epoch=0, producer_id=pid, producer_epoch=epoch,
            timestamp_ms=1_000,
        )
        header = dataclasses.replace(read_header(raw), base_offset=self.end)
        self._epoch[pid] = epoch
        self._seq[pid] = 0
        number = self._open.pop(pid, None)
        if number is not None:
            self.outcome[number] = "commit" if marker_type == MARKER_COMMIT else "abort"
        self._apply(header, (marker_type, 0))
        return header.base_offset

    def _apply(self, header: BatchHeader, control: tuple[int, int] | None) -> None:
        self.headers.append(header)
        completed = self.state.replay(header, header.base_offset, 0, control=control)
        if completed is not None and completed.aborted:
            self.aborted.add(AbortedTxn(completed.producer_id, completed.first_offset,
                                        completed.last_offset, completed.last_stable_offset))
        self.state.on_high_watermark(self.end)

    @property
    def lso(self) -> int:
        return last_stable_offset(high_watermark=self.end, log_start_offset=0,
                                  first_unstable_offset=self.state.first_unstable_offset)

    def stored_from(self, offset: int) -> Iterator[tuple[BatchHeader, int]]:
        """What the partition's scan yields: batches from the one holding offset."""
        for header in self.headers:
            if header.next_offset > offset:
                yield header, header.base_offset

    def visible(self, *, committed: bool, upper: int) -> list[int]:
        """The oracle: base offsets a reader may see below `upper`."""
        seen = []
        for header in self.headers:
            if header.next_offset > upper or header.is_control:
                continue
            _pid, number = self.owner[header.base_offset]
            if committed and number is not None and self.outcome.get(number) != "commit":
                continue
            seen.append(header.base_offset)
        return seen


def _select(log: Log, offset: int, *, committed: bool, max_bytes: int = 1 << 20,
            upper: int | None = None, take_first_whole: bool = True
            ) -> tuple[list[int], int]:
    bound = (log.lso if committed else log.end) if upper is None else upper
    selection = select_batches(
        log.stored_from(offset), fetch_offset=offset, upper_offset=bound,
        max_bytes=max_bytes, aborted=log.aborted if committed else None,
        take_first_whole=take_first_whole,
    )
    return selection.batches, selection.next_fetch_offset


def _interleaved() -> Log:
    """P1 and P2 interleave transactions; P1 aborts, P2 commits; P3 writes
    idempotently in between and P4 after."""
    log = Log()
    log.data(1, txn=True)               # 0  aborted
    log.data(2, txn=True)               # 1  committed
    log.data(1, txn=True)               # 2  aborted
    log.data(3, txn=False)              # 3
    log.data(2, txn=True)               # 4  committed
    log.marker(1, MARKER_ABORT)         # 5
    log.data(3, txn=False)              # 6
    log.marker(2, MARKER_COMMIT)        # 7
    log.data(4, txn=False)              # 8
    log.data(1, txn=True)               # 9  P1's next transaction, committed
    log.marker(1, MARKER_COMMIT)        # 10
    return log


def test_interleaved_abort_and_commit() -> None:
    log = _interleaved()
    assert log.lso == log.end == 11
    assert _select(log, 0, committed=True) == ([1, 3, 4, 6, 8, 9], 11)
    assert _select(log, 0, committed=False) == ([0, 1, 2, 3, 4, 6, 8, 9], 11)
    assert _select(log, 5, committed=True) == ([6, 8, 9], 11)
    # Starting on a marker or an aborted batch: filtered, next moves past them.
    assert _select(log, 2, committed=True) == ([3, 4, 6, 8, 9], 11)
    assert _select(log, 10, committed=True) == ([], 11)
    assert _select(log, 11, committed=True) == ([], 11)


def test_internal_readers_can_ask_for_markers_under_read_uncommitted() -> None:
    log = _interleaved()
    selection = select_batches(
        log.stored_from(0), fetch_offset=0, upper_offset=log.end, max_bytes=1 << 20,
        aborted=None, keep_control=True,
    )
    assert selection.batches == list(range(11))
    assert selection.next_fetch_offset == 11


def test_open_transaction_holds_the_lso_and_hides_later_committed_records() -> None:
    log = Log()
    log.data(1, txn=True)               # 0  open
    log.data(2, txn=True)               # 1  committed later
    log.marker(2, MARKER_COMMIT)        # 2
    log.data(3, txn=False)              # 3
    assert log.lso == 0
    assert _select(log, 0, committed=True) == ([], 0)
    assert _select(log, 0, committed=False) == ([0, 1, 3], 4)
    log.marker(1, MARKER_COMMIT)        # 4
    assert log.lso == 5
    assert _select(log, 0, committed=True) == ([0, 1, 3], 5)


def test_next_fetch_offset_never_passes_the_bound() -> None:
    log = _interleaved()
    assert _select(log, 0, committed=True, upper=5) == ([1, 3, 4], 5)
    # Everything below the bound filtered: next moves to the bound, not beyond.
    assert _select(log, 5, committed=True, upper=6) == ([], 6)
    assert _select(log, 7, committed=True, upper=7) == ([], 7)


def test_a_batch_holding_the_fetch_offset_is_returned_whole() -> None:
    log = Log()
    log.data(1, txn=False, count=3)     # 0..2
    log.data(1, txn=False, count=2)     # 3..4
    assert _select(log, 1, committed=True) == ([0, 3], 5)


def test_budget_counts_filtered_bytes_and_always_progresses() -> None:
    log = _interleaved()
    size = log.headers[0].size_bytes
    # One batch's worth: the first batch only, even when it is filtered.
    assert _select(log, 0, committed=True, max_bytes=size) == ([], 1)
    assert _select(log, 1, committed=True, max_bytes=size) == ([1], 2)
    # A budget smaller than any batch still takes one whole batch.
    assert _select(log, 1, committed=True, max_bytes=1) == ([1], 2)
    assert _select(log, 0, committed=True, max_bytes=0) == ([], 0)


def test_without_take_first_whole_the_budget_is_a_hard_limit() -> None:
    # For a partition after others in the same response: what does not fit
    # is left for the next fetch, which starts where this one would have.
    log = _interleaved()
    size = log.headers[1].size_bytes
    assert _select(log, 1, committed=True, max_bytes=size - 1, take_first_whole=False) == (
        [], 1)
    assert _select(log, 1, committed=True, max_bytes=size, take_first_whole=False) == ([1], 2)


def test_batch_straddling_the_bound_is_a_broken_invariant() -> None:
    log = Log()
    log.data(1, txn=False, count=3)
    with pytest.raises(InvariantViolation):
        _select(log, 0, committed=False, upper=2)


def _random_log(rng: random.Random, steps: int) -> Log:
    log = Log()
    for _ in range(steps):
        pid = rng.randint(1, 4)
        roll = rng.random()
        if roll < 0.55:
            log.data(pid, txn=pid != 4, count=rng.randint(1, 3))
        elif roll < 0.8:
            log.marker(pid, rng.choice((MARKER_ABORT, MARKER_COMMIT)))
        else:
            log.data(5, txn=False, count=rng.randint(1, 2))
    return log


@pytest.mark.parametrize("seed", range(40))
def test_random_interleavings_match_the_oracle(seed: int) -> None:
    rng = random.Random(seed)
    log = _random_log(rng, rng.randint(5, 80))
    for committed in (True, False):
        upper = log.lso if committed else log.end
        expected = log.visible(committed=committed, upper=upper)
        # A consumer loop at a random budget, from a random start.
        start = rng.randrange(0, log.end + 1)
        offset, seen = start, []
        max_bytes = rng.choice((1, 100, 200, 1 << 20))
        while True:
            batches, next_offset = _select(log, offset, committed=committed,
                                           max_bytes=max_bytes)
            assert offset <= next_offset <= upper or (offset == next_offset > upper)
            seen.extend(batches)
            if next_offset == offset:
                break
            offset = next_offset
        assert offset == max(start, upper)
        first = next((h.base_offset for h in log.headers if h.next_offset > start), None)
        assert seen == [o for o in expected if first is not None and o >= first], (
            f"seed {seed}, committed={committed}, start {start}"
        )


@pytest.mark.parametrize("seed", range(40))
def test_collect_finds_every_overlapping_aborted_transaction(seed: int) -> None:
    rng = random.Random(1000 + seed)
    log = _random_log(rng, rng.randint(5, 120))
    entries = log.aborted.entries()
    for _ in range(30):
        start = rng.randrange(0, log.end + 1)
        end = rng.randrange(start, log.end + 2)
        brute = [e for e in entries if e.last_offset >= start and e.first_offset < end]
        assert log.aborted.collect(start, end) == brute


def test_aborted_index_prune_and_get() -> None:
    log = _interleaved()
    log.data(2, txn=True)               # 11
    log.marker(2, MARKER_ABORT)         # 12
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in log.aborted.entries()] == [
        (1, 0, 5), (2, 11, 12)
    ]
    assert log.aborted.get(12) == AbortedTxn(2, 11, 12, 13)
    assert log.aborted.get(11) is None
    assert log.aborted.prune_below(5) == 0      # the transaction ending at 5 is still there
    assert log.aborted.prune_below(6) == 1
    assert len(log.aborted) == 1
    with pytest.raises(InvariantViolation):
        log.aborted.add(AbortedTxn(3, 0, 12, 13))   # markers come in offset order


def _compacted_log() -> list[tuple[BatchHeader, int]]:
    """Batches at 0, 3 (emptied by compaction: no records left) and 6; the
    ones at 1-2 and 4-5 were removed, so offsets have gaps."""
    out = []
    for base, count in ((0, 1), (3, 0), (6, 2)):
        raw = encode_batch([(b"k", b"v", None, 1_000)])
        header = dataclasses.replace(read_header(raw), base_offset=base,
                                     last_offset_delta=0, record_count=count)
        out.append((header, base))
    return out


def test_compaction_gaps_and_emptied_batches() -> None:
    stored = _compacted_log()

    def select(offset: int, upper: int, max_bytes: int = 1 << 20) -> tuple[list[int], int]:
        scan = [(h, p) for h, p in stored if h.next_offset > offset and h.base_offset < upper]
        selection = select_batches(scan, fetch_offset=offset, upper_offset=upper,
                                   max_bytes=max_bytes, aborted=None)
        return selection.batches, selection.next_fetch_offset

    # A fetch inside a gap gets the next surviving batch; the emptied batch
    # is never returned, but the reader moves past it.
    assert select(1, 7) == ([6], 7)
    assert select(3, 7) == ([6], 7)
    # Only removed batches below the bound: the reader moves to the bound
    # instead of waiting at the gap.
    assert select(1, 6) == ([], 6)
    assert select(4, 6) == ([], 6)
    # Stopped by the byte budget before the bound: only past what was scanned.
    first = stored[0][0].size_bytes
    assert select(0, 7, max_bytes=first) == ([0], 1)
