"""What one partition answers to reads: a consumer's fetch (whole batches up
to the HW, or the LSO under read_committed with aborted transactions and
markers filtered out), a ListOffsets lookup (earliest, latest, by time) and
a follower's fetch (everything durable here). The store node's Fetch and
ListOffsets (reads.py) and its followers' fetches (replication/serving.py) call
these for each partition of a request.

Owns nothing and changes nothing: it reads the partition it is given
(PartitionRuntime, log/partition.py), its offsets, aborted index and leader
epochs, and the batches stored for it, each checked against its CRC32C
(the partition's `read_stored`). Which batches a fetch returns is
core/fetch_filter.py's."""

from __future__ import annotations

from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import iter_records

from ...common.kernel.errors import ServiceError
from ..core.codec import decode_offset
from ..core.fetch_filter import select_batches
from ..core.txn_index import AbortedTxn
from ..storage import keys
from .partition import Isolation, PartitionRuntime

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@dataclass(frozen=True, slots=True)
class FetchRead:
    batches: list[bytes]
    size_bytes: int
    next_fetch_offset: int
    # Bytes covered: returned plus filtered (control and aborted batches).
    scanned_bytes: int = 0
    # Records in the returned batches.
    record_count: int = 0
    # With client_filters under read_committed: the aborted transactions that
    # have a batch in the returned range (Kafka's aborted_transactions).
    aborted: tuple[AbortedTxn, ...] = ()


def upper_bound(part: PartitionRuntime, isolation: Isolation) -> int:
    if isolation is Isolation.READ_COMMITTED:
        return part.log.last_stable_offset
    return part.log.high_watermark


def check_fetch_offset(part: PartitionRuntime, offset: int) -> None:
    """A fetch may start anywhere in the log, up to its end (Kafka's rule),
    and reads nothing past the HW. Not "up to the HW": a new leader's HW
    can trail the old leader's for a moment (it learns where its
    followers are on their next fetch), and a consumer already at the old
    HW would otherwise be told it is out of range and reset its position
    (to the start, re-reading everything)."""
    log_state = part.log
    if offset < 0 or offset < log_state.log_start_offset or offset > log_state.log_end_offset:
        raise ServiceError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{part.topic_partition}: offset {offset} is out of range; the log holds "
            f"offsets {log_state.log_start_offset}..{log_state.log_end_offset} (log start "
            f"offset {log_state.log_start_offset}, log end offset {log_state.log_end_offset},"
            f" high watermark {log_state.high_watermark})",
        )


def check_offsets_known(part: PartitionRuntime) -> None:
    """Kafka's KIP-207: a leader whose HW has not yet reached the start of
    its own leader epoch does not know where the committed log ends (the
    previous leader's HW may be further), so it answers a "latest" or
    time lookup with the retriable OFFSET_NOT_AVAILABLE rather than an
    end offset that goes backwards."""
    if not part.is_leader:
        return
    epoch_start = part.epochs.start_offset_of(part.state.leader_epoch)
    if epoch_start is not None and part.log.high_watermark < epoch_start:
        raise ServiceError(
            ErrorCode.OFFSET_NOT_AVAILABLE,
            f"{part.topic_partition}: leader epoch {part.state.leader_epoch} starts at "
            f"offset {epoch_start} and the high watermark is still "
            f"{part.log.high_watermark}; retry once the followers have caught up",
        )


def read(part: PartitionRuntime, offset: int, *, max_bytes: int, isolation: Isolation,
         include_control: bool = False, take_first_whole: bool = True,
         client_filters: bool = False) -> FetchRead:
    """Whole batches from the one holding `offset`, up to the HW (the LSO
    under read_committed), without control batches and, under
    read_committed, without batches of aborted transactions
    (core/fetch_filter.py). With `take_first_whole` the first batch is
    returned even when it is larger than max_bytes.

    `client_filters` (Kafka's clients): every batch below the bound,
    control and aborted ones included, and under read_committed the
    aborted transactions of the returned range, from which the reader
    drops aborted batches itself."""
    check_fetch_offset(part, offset)
    upper = upper_bound(part, isolation)
    committed = isolation is Isolation.READ_COMMITTED
    selection = select_batches(
        part.read_stored(offset, upper), fetch_offset=offset, upper_offset=upper,
        max_bytes=max_bytes,
        aborted=part.aborted if committed and not client_filters else None,
        keep_control=client_filters or (include_control and not committed),
        keep_empty=client_filters,
        take_first_whole=take_first_whole,
    )
    aborted: tuple[AbortedTxn, ...] = ()
    if client_filters and committed and selection.batches:
        aborted = tuple(part.aborted.collect(offset, selection.next_fetch_offset))
    return FetchRead(
        selection.batches, selection.size_bytes, selection.next_fetch_offset,
        scanned_bytes=selection.scanned_bytes, record_count=selection.record_count,
        aborted=aborted,
    )


def list_offset(
    part: PartitionRuntime, timestamp_ms: int, isolation: Isolation,
) -> tuple[int, int]:
    """(offset, timestamp_ms) for ListOffsets: -2 earliest, -1 latest (HW,
    or LSO under read_committed), else the first record whose timestamp is
    >= timestamp_ms (-1, -1 when none is)."""
    if timestamp_ms == EARLIEST_TIMESTAMP:
        return part.log.log_start_offset, -1
    if timestamp_ms == LATEST_TIMESTAMP:
        check_offsets_known(part)
        return upper_bound(part, isolation), -1
    if timestamp_ms < 0:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"{part.topic_partition}: timestamp {timestamp_ms} is neither -1 (latest), "
            "-2 (earliest) nor a time >= 0",
        )
    check_offsets_known(part)
    tid, p = part.topic.topic_id, part.partition
    time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, p)
    first = next(
        part.store.scan(
            keys.time_index_key(tid, p, timestamp_ms), keys.next_prefix(time_prefix)
        ),
        None,
    )
    if first is None:
        return -1, -1
    indexed = decode_offset(first[1], what=f"{part.topic_partition} time index")
    start = max(indexed, part.log.log_start_offset)
    upper = upper_bound(part, isolation)
    if start >= upper:
        return -1, -1
    for header, value in part.read_stored(start, upper):
        if header.is_control or header.max_timestamp_ms < timestamp_ms:
            continue
        for record in iter_records(value, min_offset=start):
            if record.timestamp_ms >= timestamp_ms:
                return record.offset, record.timestamp_ms
    return -1, -1


def read_replica(part: PartitionRuntime, offset: int, *,
                 max_bytes: int) -> tuple[list[bytes], int]:
    """For a follower: the stored batches from `offset` (a batch
    boundary: its log end offset) up to this replica's durable end,
    control batches and aborted transactions included, the first one
    whole; and the offset after the last one returned."""
    batches: list[bytes] = []
    size = 0
    next_offset = offset
    for header, value in part.read_stored(offset, part.log.durable_end_offset):
        if batches and size + len(value) > max_bytes:
            break
        batches.append(value)
        size += len(value)
        next_offset = header.next_offset
    return batches, next_offset
