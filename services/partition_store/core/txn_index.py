"""The aborted-transaction index of one partition (Kafka's transaction index).

One entry per transaction that an ABORT marker ended on this partition:
(producer id, first offset, last offset = the marker's offset, and the LSO
right after the marker). A transactional batch of producer P at offset o is
aborted iff the index holds an entry for P with first_offset <= o <=
last_offset: a producer has at most one transaction open per partition, so its
transactions there never overlap, and every transactional batch it wrote in
between belongs to the one the entry describes.

Entries are kept in marker order (= last_offset order). The index is
persisted entry by entry (the `A` keys of storage/keys.py, written in the same
RocksDB write as the marker), so read_committed never scans the log to find
aborted transactions and recovery loads it instead of rebuilding it.

Why last_stable_offset is stored: to find the aborted transactions that
overlap a range [start, end), a reader starts at the first entry with
last_offset >= start and walks forward. Entries are sorted by their last
offset, not their first, so when can it stop? Every transaction that ends
after entry e either started after e's marker (first offset > e's marker
offset) or was open when e's marker was written (first offset >= the LSO
after e). Either way its first offset is >= e.last_stable_offset. So once an
entry has last_stable_offset >= end, no later entry can start before `end`.
The walk is bounded by the transactions that end inside the range plus those
open across it (Kafka's collectAbortedTxns does the same).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from ...common.kernel.invariants import invariant
from .codec import CorruptValueError, seal, unseal

ABORTED_TXN_VERSION = 1
_ABORTED_TXN = struct.Struct(">qqq")  # producer_id, first_offset, last_stable_offset


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def contains(self, producer_id: int, offset: int) -> bool:
        return producer_id == self.producer_id and self.first_offset <= offset <= self.last_offset


def encode_aborted_txn(entry: AbortedTxn) -> bytes:
    """The value of an `A` key (its key holds last_offset)."""
    return seal(
        ABORTED_TXN_VERSION,
        _ABORTED_TXN.pack(entry.producer_id, entry.first_offset, entry.last_stable_offset),
    )


def decode_aborted_txn(last_offset: int, data: bytes, *, what: str) -> AbortedTxn:
    payload = unseal(data, version=ABORTED_TXN_VERSION, what=what)
    if len(payload) != _ABORTED_TXN.size:
        raise CorruptValueError(
            f"{what}: {len(payload)}-byte payload, expected {_ABORTED_TXN.size}"
        )
    producer_id, first_offset, last_stable_offset = _ABORTED_TXN.unpack(payload)
    if not (0 <= first_offset <= last_offset and 0 <= last_stable_offset <= last_offset + 1):
        raise CorruptValueError(
            f"{what}: offsets out of order (first {first_offset}, last {last_offset}, "
            f"stable after {last_stable_offset})"
        )
    return AbortedTxn(int(producer_id), int(first_offset), last_offset, int(last_stable_offset))


class AbortedIndex:
    """The aborted transactions of one partition, in marker order."""

    __slots__ = ("_entries", "_last_offsets", "topic_partition")

    def __init__(self, topic_partition: str, entries: Iterable[AbortedTxn] = ()) -> None:
        self.topic_partition = topic_partition
        self._entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []
        for entry in entries:
            self.add(entry)

    def add(self, entry: AbortedTxn) -> None:
        """Appends the entry of an ABORT marker (markers come in offset order)."""
        invariant(
            not self._last_offsets or entry.last_offset > self._last_offsets[-1],
            lambda: f"{self.topic_partition}: aborted transaction ending at "
            f"{entry.last_offset} added after one ending at {self._last_offsets[-1]}",
        )
        invariant(
            entry.first_offset <= entry.last_offset
            and entry.last_stable_offset <= entry.last_offset + 1,
            lambda: f"{self.topic_partition}: aborted transaction with offsets out of "
            f"order: {entry}",
        )
        self._entries.append(entry)
        self._last_offsets.append(entry.last_offset)

    def get(self, last_offset: int) -> AbortedTxn | None:
        """The entry whose marker is at last_offset."""
        i = bisect.bisect_left(self._last_offsets, last_offset)
        if i < len(self._entries) and self._last_offsets[i] == last_offset:
            return self._entries[i]
        return None

    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def prune_below(self, log_start_offset: int) -> int:
        """Drops transactions that ended below the log start (retention
        deleted all their batches and their marker). Returns how many."""
        i = bisect.bisect_left(self._last_offsets, log_start_offset)
        del self._entries[:i]
        del self._last_offsets[:i]
        return i

    def remove(self, last_offset: int) -> bool:
        """Drops the entry whose ABORT marker at last_offset compaction
        removed (with every record of its transaction). The early stop of
        `collect` holds for the entries left: it relies on each entry's own
        last_stable_offset, not on its neighbours."""
        i = bisect.bisect_left(self._last_offsets, last_offset)
        if i < len(self._entries) and self._last_offsets[i] == last_offset:
            del self._entries[i]
            del self._last_offsets[i]
            return True
        return False

    def collect(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Every aborted transaction with a batch in [start_offset,
        end_offset): last_offset >= start_offset and first_offset <
        end_offset (the module docstring says why the walk may stop early)."""
        found = []
        i = bisect.bisect_left(self._last_offsets, start_offset)
        entries = self._entries
        for j in range(i, len(entries)):
            entry = entries[j]
            if entry.first_offset < end_offset:
                found.append(entry)
            if entry.last_stable_offset >= end_offset:
                break
        return found
