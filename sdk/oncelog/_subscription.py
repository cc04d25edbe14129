"""The consumer's subscription state: what it reads and where it stands.

`SubscriptionState` owns the partitions the consumer reads (assigned by
assign() or by its group), each one's `PartitionState` (position, pending
reset, backoff, the fetched data not yet handed out), the topics subscribed
to, and the reset policy (auto_offset_reset). It sends nothing: the fetcher
(`_fetcher.Fetcher`) fills and drains the partitions' buffers and resolves
their resets, the consumer (`consumer.Consumer`) applies its group's
assignment changes here. As Kafka's SubscriptionState, it is used from the
application's thread only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from oncelog._client import backoff_ms
from oncelog.types import TopicPartition
from oncelog.wire import errors
from oncelog.wire import records as codec
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.vocabulary import OffsetReset

EARLIEST = OffsetReset.EARLIEST.value
LATEST = OffsetReset.LATEST.value
NONE = OffsetReset.NONE.value
# A partition a group assigned: it starts at the group's committed offset
# (auto_offset_reset when there is none).
COMMITTED = "committed"


@dataclass(eq=False)
class PartitionState:
    """One assigned partition. Mutable, and dropped whole when the partition
    is unassigned: its fetched data goes with its position, so a seek or a
    revocation can never leave records of the old position buffered."""

    # Offset of the next record poll() returns; None until resolved by `reset`.
    position: int | None = None
    reset: str | None = None
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # Fetched and not yet handed out: batches, and the iterator over them.
    batches: deque[bytes] = field(default_factory=deque)
    records: Iterator[codec.RecordFields] | None = None
    # The offset after the last buffered batch: where a fetch ahead starts.
    next_fetch_offset: int = -1
    retry_at_s: float = 0.0
    attempts: int = 0

    @property
    def has_buffered(self) -> bool:
        return self.records is not None

    @property
    def fetch_offset(self) -> int | None:
        """Where the partition's next fetch starts: after what is buffered,
        else at the position (None: no position yet)."""
        return self.next_fetch_offset if self.records is not None else self.position

    def unread_bytes(self) -> int:
        """Bytes of the buffered batches not begun yet: the fetcher fetches
        ahead while fewer than one fetch's worth are left."""
        return sum(map(len, self.batches))

    def clear_buffer(self) -> None:
        self.batches.clear()
        self.records = None
        self.next_fetch_offset = -1

    def finish_buffer(self) -> None:
        """Every buffered record was handed out: the position moves past
        everything the fetch covered (records it filtered out included), and
        the buffer is dropped."""
        if self.position is not None and self.next_fetch_offset > self.position:
            self.position = self.next_fetch_offset
        self.clear_buffer()


class SubscriptionState:
    """The assigned partitions and their states, the subscribed topics, and
    the reset policy."""

    def __init__(self, *, auto_offset_reset: OffsetReset, retry_backoff_ms: int,
                 retry_backoff_max_ms: int) -> None:
        self.auto_offset_reset = auto_offset_reset
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_backoff_max_ms = retry_backoff_max_ms
        # In assignment order: fetches and drains rotate through it.
        self._assignment: dict[TopicPartition, PartitionState] = {}
        # The topics subscribe() named (sorted); None without subscribe().
        self.topics: tuple[str, ...] | None = None

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Reads exactly `partitions` from now on: kept ones keep their states,
        new ones start per the reset policy."""
        old = self._assignment
        self._assignment = {
            tp: old.get(tp) or PartitionState(reset=self.default_reset()) for tp in partitions
        }

    def assign_from_group(self, partition: TopicPartition) -> None:
        """Takes on a partition the group assigned: it starts at the group's
        committed offset."""
        self._assignment[partition] = PartitionState(reset=COMMITTED)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drops the partitions' positions and fetched data: nothing of them
        is returned from now on (answers of fetches in flight are ignored)."""
        for tp in partitions:
            self._assignment.pop(tp, None)

    def clear(self) -> None:
        self._assignment = {}

    def partitions(self) -> list[TopicPartition]:
        """The assigned partitions, in assignment order."""
        return list(self._assignment)

    def items(self) -> list[tuple[TopicPartition, PartitionState]]:
        """The assigned partitions and their states, in assignment order."""
        return list(self._assignment.items())

    def states(self) -> Iterable[PartitionState]:
        return self._assignment.values()

    @property
    def has_partitions(self) -> bool:
        return bool(self._assignment)

    def __contains__(self, partition: object) -> bool:
        return partition in self._assignment

    def get(self, partition: TopicPartition) -> PartitionState | None:
        return self._assignment.get(partition)

    def state(self, partition: TopicPartition) -> PartitionState:
        """The partition's state; IllegalStateError when it is not assigned."""
        st = self._assignment.get(partition)
        if st is None:
            raise errors.IllegalStateError(
                f"partition {partition.topic}-{partition.partition} is not assigned")
        return st

    # ------------------------------------------------------------ subscription

    @property
    def subscribed(self) -> bool:
        """Whether a group assigns the partitions (subscribe())."""
        return self.topics is not None

    def group_is_ahead(self, exc: OncelogError) -> bool:
        """Whether `exc` says a partition the group assigned is not in this
        consumer's metadata yet: the group coordinator learned of a topic's
        new partitions (CreatePartitions) before the store this consumer
        asked did. Retried after a backoff, not raised: the partition
        exists, and a topic really gone is revoked by the coordinator."""
        return self.subscribed and exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # ------------------------------------------------------------ positions

    def default_reset(self) -> str | None:
        """Where a partition without a position starts (None: nowhere, the
        application must seek: auto_offset_reset='none')."""
        return None if self.auto_offset_reset == NONE else self.auto_offset_reset

    def seek(self, partition: TopicPartition, offset: int) -> None:
        st = self.state(partition)
        st.position = offset
        st.reset = None
        st.clear_buffer()

    def seek_to(self, partitions: Iterable[TopicPartition] | None, where: str) -> None:
        """Moves the partitions (default: every assigned one) to `where`
        (EARLIEST or LATEST), resolved lazily."""
        tps = list(self._assignment) if partitions is None else list(partitions)
        for tp in tps:
            st = self.state(tp)
            st.position = None
            st.reset = where
            st.clear_buffer()

    def positions(self, partitions: Iterable[TopicPartition] | None = None,
                  ) -> dict[TopicPartition, int]:
        """The known positions of `partitions` (default: every assigned one);
        unassigned partitions and those without a position are left out."""
        tps = self._assignment if partitions is None else partitions
        return {tp: st.position for tp in tps
                if (st := self._assignment.get(tp)) is not None and st.position is not None}

    def unresolved(self) -> list[TopicPartition]:
        """The partitions waiting for a position (a reset or a committed offset)."""
        return [tp for tp, st in self._assignment.items() if st.position is None]

    def back_off(self, st: PartitionState) -> None:
        """Waits before fetching or resetting the partition again (backoff
        growing with its failed attempts)."""
        st.attempts += 1
        st.retry_at_s = time.monotonic() + backoff_ms(
            st.attempts, base_ms=self._retry_backoff_ms, max_ms=self._retry_backoff_max_ms
        ) / 1000
