"""Which stored batches a fetch returns, and where the next fetch starts.

The filtering of read_committed happens here, on the server, so a client in
any language needs no bookkeeping (DESIGN.md §1, §3):

* only batches below the upper bound: the LSO under read_committed, the HW
  under read_uncommitted (the caller passes it);
* never control batches (markers), unless the caller asks for them (internal
  readers under read_uncommitted that follow transaction outcomes);
* under read_committed, never batches of aborted transactions: a
  transactional batch of producer P at offset o is dropped iff the aborted
  index has an entry for P with first_offset <= o <= last_offset. Batches are
  whole units of one producer and one transaction, so whole-batch filtering
  is exact;
* never batches that compaction emptied (no records left: kept only for
  their producer fields), unless the caller asks for them;
* a caller whose readers filter by themselves (Kafka's clients: they skip
  control batches and drop aborted transactions' batches from the
  `aborted_transactions` of the answer, and take the next offset from the
  last batch they were given) asks for every batch below the upper bound:
  no aborted index, control and emptied batches kept;
* `next_fetch_offset` moves past everything returned AND everything
  filtered, never past the upper bound. When the scan reached the upper
  bound, it is the upper bound: compaction may have removed the batches
  just below it, and a reader must not wait at a gap for data that will
  never come.

Work per fetch is bounded by bytes scanned, filtered batches included: the
scan stops once it has covered max_bytes of log (the first batch is taken
whole, even when larger, so a fetch always makes progress — unless the
caller says otherwise: a response that already holds other partitions'
batches must stay within its limit). A reader
behind a long run of aborted batches therefore gets few or no batches but a
next_fetch_offset past them, and comes back for more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from oncelog.wire.records import BatchHeader

from ...common.kernel.invariants import InvariantViolation
from .txn_index import AbortedIndex, AbortedTxn

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FetchSelection(Generic[T]):
    """The payloads of the returned batches, in offset order."""

    batches: list[T] = field(default_factory=list)
    # Bytes of the returned batches.
    size_bytes: int = 0
    # Bytes scanned: returned plus filtered.
    scanned_bytes: int = 0
    filtered_batches: int = 0
    next_fetch_offset: int = 0
    # Records in the returned batches.
    record_count: int = 0


def select_batches(
    stored: Iterable[tuple[BatchHeader, T]],
    *,
    fetch_offset: int,
    upper_offset: int,
    max_bytes: int,
    aborted: AbortedIndex | None,
    keep_control: bool = False,
    keep_empty: bool = False,
    take_first_whole: bool = True,
) -> FetchSelection[T]:
    """`stored` are the batches from the one holding fetch_offset on, in
    offset order; it is read lazily and only as far as the scan goes.
    `aborted` is the partition's aborted index under read_committed, None
    under read_uncommitted (which returns aborted batches too).
    `take_first_whole`: the first batch is taken even when larger than
    max_bytes. `keep_empty`: batches compaction emptied are returned too."""
    scanned: list[tuple[BatchHeader, T]] = []
    scanned_bytes = 0
    # Whether every stored batch below the upper bound was scanned.
    reached_upper = False
    if fetch_offset < upper_offset and max_bytes > 0:
        reached_upper = True
        for header, payload in stored:
            if header.base_offset >= upper_offset:
                break
            if header.next_offset > upper_offset:
                raise InvariantViolation(
                    f"batch {header.base_offset}..{header.last_offset} straddles the fetch "
                    f"bound {upper_offset} (bounds are batch boundaries)"
                )
            size = header.size_bytes
            if (scanned or not take_first_whole) and scanned_bytes + size > max_bytes:
                reached_upper = False
                break
            scanned.append((header, payload))
            scanned_bytes += size
            if scanned_bytes >= max_bytes:
                reached_upper = header.next_offset >= upper_offset
                break
    if not scanned:
        return FetchSelection(
            next_fetch_offset=upper_offset if reached_upper else fetch_offset
        )
    overlapping: dict[int, list[AbortedTxn]] = {}
    if aborted is not None:
        for entry in aborted.collect(scanned[0][0].base_offset, scanned[-1][0].next_offset):
            overlapping.setdefault(entry.producer_id, []).append(entry)
    batches: list[T] = []
    size_bytes = 0
    record_count = 0
    for header, payload in scanned:
        if (header.is_control and not keep_control) or (
            header.record_count == 0 and not keep_empty
        ) or (
            overlapping
            and header.is_transactional
            and header.producer_id in overlapping
            and any(e.contains(header.producer_id, header.base_offset)
                    for e in overlapping[header.producer_id])
        ):
            continue
        batches.append(payload)
        size_bytes += header.size_bytes
        record_count += header.record_count
    filtered = len(scanned) - len(batches)
    return FetchSelection(
        batches=batches,
        size_bytes=size_bytes,
        scanned_bytes=scanned_bytes,
        filtered_batches=filtered,
        next_fetch_offset=max(
            fetch_offset, upper_offset if reached_upper else scanned[-1][0].next_offset
        ),
        record_count=record_count,
    )
