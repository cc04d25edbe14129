"""The consumer (manual assignment; consumer groups arrive in a later version).

`poll()` fetches from every store node that owns assigned partitions in
parallel (one Fetch in flight per node, long-polling up to fetch_max_wait_ms),
keeps what it fetched as encoded batches, and decodes records only as it hands
them out, at most max_poll_records per call; the rest stays buffered for the
next poll. A partition is fetched again once its buffer is empty, from its
position; after the buffer is used up the position moves to the store's
`next_fetch_offset`, past batches the store filtered out (aborted
transactions, control batches), so a read_committed consumer never stalls on
them. Fetches stay in flight between polls, so poll(timeout=0) picks up their
answers later.

Not thread-safe, like Kafka's consumer: use one consumer from one thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType

import grpc

from oncelog import errors
from oncelog import records as codec
from oncelog._client import (
    ClusterClient,
    backoff_ms,
    error_from_proto,
    needs_metadata_refresh,
    translate_rpc_error,
)
from oncelog.errors import ErrorCode, OncelogError
from oncelog.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from oncelog.v1 import partition_store_pb2, records_pb2

log = logging.getLogger("oncelog.consumer")

EARLIEST = "earliest"
LATEST = "latest"
NONE = "none"
_RESET_TIMESTAMPS = {EARLIEST: -2, LATEST: -1}
_ISOLATION = {
    "read_committed": records_pb2.IsolationLevel.READ_COMMITTED,
    "read_uncommitted": records_pb2.IsolationLevel.READ_UNCOMMITTED,
}
# Longest a store may make a Fetch wait (services/common/limits.py MAX_FETCH_WAIT_MS).
MAX_FETCH_WAIT_MS = 30_000


@dataclass(eq=False)
class _PartitionState:
    # Offset of the next record poll() returns; None until resolved by `reset`.
    position: int | None = None
    reset: str | None = None
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # Fetched and not yet handed out: batches, and the iterator over them.
    batches: deque[bytes] = field(default_factory=deque)
    records: Iterator[codec.Record] | None = None
    next_fetch_offset: int = -1
    retry_at_s: float = 0.0
    attempts: int = 0

    @property
    def has_buffered(self) -> bool:
        return self.records is not None

    def clear_buffer(self) -> None:
        self.batches.clear()
        self.records = None
        self.next_fetch_offset = -1


@dataclass(eq=False)
class _InFlightFetch:
    address: str
    call: grpc.Future
    # The offset each partition was fetched from: an answer for a partition
    # whose position moved meanwhile (seek) is dropped.
    offsets: dict[TopicPartition, int]


class Consumer:
    """Reads records from assigned partitions."""

    def __init__(
        self,
        *,
        bootstrap: str,
        group_id: str | None = None,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = EARLIEST,
        enable_auto_commit: bool = False,
        max_poll_records: int = 500,
        session_timeout_ms: int = 10_000,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        default_api_timeout_ms: int = 60_000,
        check_crcs: bool = True,
    ) -> None:
        if isolation_level not in _ISOLATION:
            raise ValueError(
                f"isolation_level must be one of {sorted(_ISOLATION)}, got {isolation_level!r}"
            )
        if auto_offset_reset not in (EARLIEST, LATEST, NONE):
            raise ValueError(
                f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                f"got {auto_offset_reset!r}"
            )
        if enable_auto_commit:
            raise errors.error_for(
                ErrorCode.UNSUPPORTED_VERSION,
                "enable_auto_commit needs consumer groups, which are not available in this "
                "version of the oncelog SDK",
            )
        if max_poll_records < 1:
            raise ValueError(f"max_poll_records must be >= 1, got {max_poll_records}")
        if not 0 <= fetch_max_wait_ms <= MAX_FETCH_WAIT_MS:
            raise ValueError(
                f"fetch_max_wait_ms must be within 0..{MAX_FETCH_WAIT_MS}, got {fetch_max_wait_ms}"
            )
        if fetch_min_bytes < 0 or fetch_max_bytes <= 0 or max_partition_fetch_bytes <= 0:
            raise ValueError("fetch sizes must be positive (fetch_min_bytes may be 0)")
        if session_timeout_ms <= 0:
            raise ValueError(f"session_timeout_ms must be positive, got {session_timeout_ms}")
        self.group_id = group_id
        self.isolation_level = isolation_level
        self._isolation = _ISOLATION[isolation_level]
        self.auto_offset_reset = auto_offset_reset
        self.session_timeout_ms = session_timeout_ms
        self._max_poll_records = max_poll_records
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._fetch_min_bytes = fetch_min_bytes
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_backoff_max_ms = retry_backoff_max_ms
        self._default_api_timeout_ms = default_api_timeout_ms
        self._check_crcs = check_crcs
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
        )
        self._assignment: dict[TopicPartition, _PartitionState] = {}
        self._in_flight: dict[str, _InFlightFetch] = {}
        self._node_retry_at_s: dict[str, float] = {}
        self._node_attempts: dict[str, int] = {}
        # Fetch answers arrive on gRPC threads; poll() waits on this.
        self._fetch_done = threading.Condition()
        self._fetch_done_count = 0
        self._next_drain_index = 0
        self._last_refresh_s = 0.0
        self._closed = False

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Reads exactly these partitions from now on (replacing any earlier
        assignment). A newly assigned partition starts per auto_offset_reset
        unless seek() says otherwise; kept ones keep their positions."""
        self._check_open()
        wanted: list[TopicPartition] = []
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() takes TopicPartition values, got {tp!r}")
            if tp.partition < 0:
                raise ValueError(f"partition must be >= 0, got {tp}")
            if tp not in wanted:
                wanted.append(tp)
        old = self._assignment
        self._assignment = {
            tp: old.get(tp) or _PartitionState(reset=self._default_reset()) for tp in wanted
        }

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition numbers; raises UnknownTopicOrPartitionError."""
        self._check_open()
        info = self._client.call(
            "Metadata", lambda _timeout_s: self._client.topic(topic),
            timeout_ms=self._default_api_timeout_ms,
        )
        return set(range(info.num_partitions))

    def _default_reset(self) -> str | None:
        return None if self.auto_offset_reset == NONE else self.auto_offset_reset

    def _state(self, tp: TopicPartition) -> _PartitionState:
        st = self._assignment.get(tp)
        if st is None:
            raise errors.IllegalStateError(f"partition {tp.topic}-{tp.partition} is not assigned")
        return st

    # ------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next poll() returns records of `partition` from `offset` on."""
        self._check_open()
        if type(offset) is not int or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        st = self._state(partition)
        st.position = offset
        st.reset = None
        st.clear_buffer()

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Moves to the earliest offset (resolved lazily, at the next poll() or position())."""
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Moves to the end: the last stable offset under read_committed, the
        high watermark under read_uncommitted (resolved lazily)."""
        self._seek_to(partitions, LATEST)

    def _seek_to(self, partitions: Iterable[TopicPartition] | None, where: str) -> None:
        self._check_open()
        tps = list(self._assignment) if partitions is None else list(partitions)
        for tp in tps:
            st = self._state(tp)
            st.position = None
            st.reset = where
            st.clear_buffer()

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record poll() will return for the partition."""
        self._check_open()
        st = self._state(partition)
        if st.position is None:
            self._resolve_positions(
                [partition], budget_ms=self._default_api_timeout_ms, raise_errors=True
            )
        if st.position is None:  # pragma: no cover - _resolve_positions raised
            raise errors.KafkaTimeoutError(f"no position for {partition}")
        return st.position

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest offset still in each partition's log."""
        answers = self._list_offsets({tp: -2 for tp in partitions})
        return {tp: offset for tp, (offset, _ts) in answers.items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end of each partition for this consumer: the last stable offset
        under read_committed, the high watermark under read_uncommitted."""
        answers = self._list_offsets({tp: -1 for tp in partitions})
        return {tp: offset for tp, (offset, _ts) in answers.items()}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose record timestamp is at or after
        the given one (milliseconds), or None when there is none."""
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        answers = self._list_offsets(dict(timestamps))
        return {
            tp: None if offset < 0 else OffsetAndTimestamp(offset, ts)
            for tp, (offset, ts) in answers.items()
        }

    def _list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        budget_ms: int | None = None,
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets for each partition at its owner, with retries."""
        self._check_open()
        pending = dict(timestamps)
        for tp in pending:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartition values, got {tp!r}")
        answers: dict[TopicPartition, tuple[int, int]] = {}

        def attempt(timeout_s: float) -> dict[TopicPartition, tuple[int, int]]:
            by_address: dict[str, list[TopicPartition]] = {}
            for tp in pending:
                by_address.setdefault(self._client.leader(tp.topic, tp.partition), []).append(tp)
            retry: OncelogError | None = None
            for address, tps in by_address.items():
                request = partition_store_pb2.ListOffsetsRequest(
                    partitions=[
                        partition_store_pb2.ListOffsetsPartition(
                            topic=tp.topic, partition=tp.partition, timestamp_ms=pending[tp],
                        )
                        for tp in tps
                    ],
                    isolation_level=self._isolation,
                )
                resp = self._client.store(address).ListOffsets(request, timeout=timeout_s)
                for result in resp.results:
                    tp = TopicPartition(result.topic, result.partition)
                    if tp not in pending:
                        continue
                    exc = error_from_proto(result.error)
                    if exc is None:
                        answers[tp] = (result.offset, result.timestamp_ms)
                        del pending[tp]
                    elif exc.retriable:
                        retry = exc
                    elif exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        # Metadata names this store as the owner, but the topic
                        # has not reached its catalog yet (just created): retry
                        # with backoff. A topic really gone fails the next
                        # attempt's metadata lookup instead.
                        retry = errors.error_for(
                            ErrorCode.LEADER_NOT_AVAILABLE,
                            f"store {address} does not know {tp.topic}-{tp.partition} yet: "
                            f"{exc.message or exc.code.name}",
                        )
                    else:
                        raise exc
            if pending:
                raise retry or errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"ListOffsets answered nothing for {sorted(pending)}",
                )
            return answers

        return self._client.call(
            "ListOffsets", attempt,
            timeout_ms=self._default_api_timeout_ms if budget_ms is None else budget_ms,
        )

    def _resolve_positions(
        self, tps: list[TopicPartition], *, budget_ms: int, raise_errors: bool
    ) -> None:
        """Sets the position of partitions waiting for a reset (earliest or
        latest). With raise_errors False, a failure leaves them unresolved, to
        be tried again on a later poll (after a backoff)."""
        wanted: dict[TopicPartition, int] = {}
        now_s = time.monotonic()
        for tp in tps:
            st = self._assignment[tp]
            if st.position is not None:
                continue
            if st.reset is None:
                raise errors.error_for(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"partition {tp.topic}-{tp.partition} has no position and "
                    f"auto_offset_reset='none'; seek() first",
                )
            if raise_errors or now_s >= st.retry_at_s:
                wanted[tp] = _RESET_TIMESTAMPS[st.reset]
        if not wanted:
            return
        try:
            answers = self._list_offsets(wanted, budget_ms=budget_ms)
        except OncelogError as exc:
            if raise_errors or not exc.retriable:
                raise
            for tp in wanted:
                self._back_off(self._assignment[tp])
            log.debug("position reset failed, will retry: %s", exc)
            return
        for tp, (offset, _ts) in answers.items():
            resolved = self._assignment.get(tp)
            if resolved is not None and resolved.position is None:
                resolved.position = max(offset, 0)
                resolved.reset = None
                resolved.attempts = 0

    def _back_off(self, st: _PartitionState) -> None:
        st.attempts += 1
        st.retry_at_s = time.monotonic() + backoff_ms(
            st.attempts, base_ms=self._retry_backoff_ms, max_ms=self._retry_backoff_max_ms
        ) / 1000

    # ------------------------------------------------------------ polling

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, at most max_poll_records;
        waits up to `timeout` seconds for some to arrive, then returns an
        empty list."""
        self._check_open()
        if not self._assignment:
            raise errors.IllegalStateError("poll() without assigned partitions; assign() first")
        deadline_s = time.monotonic() + max(timeout, 0.0)
        while True:
            self._collect_fetches()
            out = self._drain(self._max_poll_records)
            if out:
                self._send_fetches()  # prefetch while the caller works on these
                return out
            remaining_s = deadline_s - time.monotonic()
            unresolved = [tp for tp, st in self._assignment.items() if st.position is None]
            if unresolved:
                self._resolve_positions(
                    unresolved, budget_ms=max(int(remaining_s * 1000), 1), raise_errors=False,
                )
            self._send_fetches()
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return []
            self._wait_for_fetch(remaining_s)

    def _wait_for_fetch(self, max_wait_s: float) -> None:
        """Sleeps until a fetch answers, a backoff ends, or max_wait_s passes."""
        wake_s = time.monotonic() + max_wait_s
        for st in self._assignment.values():
            if st.retry_at_s > time.monotonic():
                wake_s = min(wake_s, st.retry_at_s)
        for retry_at in self._node_retry_at_s.values():
            if retry_at > time.monotonic():
                wake_s = min(wake_s, retry_at)
        with self._fetch_done:
            if any(f.call.done() for f in self._in_flight.values()):
                return
            wait_s = wake_s - time.monotonic()
            if wait_s > 0:
                self._fetch_done.wait(wait_s)

    def _send_fetches(self) -> None:
        now_s = time.monotonic()
        md = self._client.cached_metadata
        by_address: dict[str, dict[TopicPartition, int]] = {}
        missing_leader = False
        for tp, st in self._assignment.items():
            if st.position is None or st.has_buffered or now_s < st.retry_at_s:
                continue
            address = md.leader_address(tp.topic, tp.partition) if md is not None else None
            if address is None:
                missing_leader = True
                continue
            if address in self._in_flight or now_s < self._node_retry_at_s.get(address, 0.0):
                continue
            by_address.setdefault(address, {})[tp] = st.position
        if missing_leader:
            self._refresh_metadata_for_fetch()
        for address, offsets in by_address.items():
            request = partition_store_pb2.FetchRequest(
                partitions=[
                    partition_store_pb2.FetchPartition(
                        topic=tp.topic, partition=tp.partition, fetch_offset=offset,
                        max_bytes=self._max_partition_fetch_bytes,
                    )
                    for tp, offset in offsets.items()
                ],
                max_wait_ms=self._fetch_max_wait_ms,
                min_bytes=self._fetch_min_bytes,
                max_bytes=self._fetch_max_bytes,
                isolation_level=self._isolation,
            )
            timeout_s = (self._fetch_max_wait_ms + self._request_timeout_ms) / 1000
            try:
                call = self._client.store(address).Fetch.future(request, timeout=timeout_s)
            except (OncelogError, ValueError, RuntimeError) as exc:
                log.debug("cannot fetch from %s: %s", address, exc)
                self._back_off_node(address)
                continue
            self._in_flight[address] = _InFlightFetch(address, call, offsets)
            call.add_done_callback(self._on_fetch_done)

    def _on_fetch_done(self, _call: grpc.Future) -> None:
        with self._fetch_done:
            self._fetch_done_count += 1
            self._fetch_done.notify_all()

    def _refresh_metadata_for_fetch(self) -> None:
        """Asks for metadata again, at most once per retry_backoff_ms; raises
        UnknownTopicOrPartitionError for an assigned partition that does not exist."""
        now_s = time.monotonic()
        if (now_s - self._last_refresh_s) * 1000 < self._retry_backoff_ms:
            return
        self._last_refresh_s = now_s
        try:
            md = self._client.refresh_metadata()
        except OncelogError as exc:
            log.debug("metadata refresh failed: %s", exc)
            return
        for tp in self._assignment:
            info = md.topics.get(tp.topic)
            if info is None or tp.partition >= info.num_partitions:
                raise errors.error_for(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"assigned partition {tp.topic}-{tp.partition} does not exist"
                    + ("" if info is None else f" (the topic has {info.num_partitions})"),
                )

    def _back_off_node(self, address: str) -> None:
        attempts = self._node_attempts.get(address, 0) + 1
        self._node_attempts[address] = attempts
        self._node_retry_at_s[address] = time.monotonic() + backoff_ms(
            attempts, base_ms=self._retry_backoff_ms, max_ms=self._retry_backoff_max_ms
        ) / 1000

    def _collect_fetches(self) -> None:
        """Takes the answers of finished fetches into the partition buffers."""
        refresh = False
        for address, fetch in list(self._in_flight.items()):
            if not fetch.call.done():
                continue
            del self._in_flight[address]
            try:
                resp = fetch.call.result()
            except grpc.RpcError as rpc_exc:
                exc = translate_rpc_error(rpc_exc)
                log.debug("Fetch from %s failed: %s", address, exc)
                if not exc.retriable:
                    raise exc from None
                self._back_off_node(address)
                refresh = refresh or needs_metadata_refresh(exc)
                continue
            except Exception as other:  # FutureCancelledError when closing
                log.debug("Fetch from %s ended: %r", address, other)
                continue
            self._node_attempts.pop(address, None)
            self._node_retry_at_s.pop(address, None)
            for result in resp.results:
                tp = TopicPartition(result.topic, result.partition)
                st = self._assignment.get(tp)
                fetched_from = fetch.offsets.get(tp)
                if st is None or fetched_from is None or st.position != fetched_from:
                    continue  # unassigned or moved by seek() meanwhile
                refresh = self._take_result(tp, st, result) or refresh
        if refresh:
            self._refresh_metadata_for_fetch()

    def _take_result(
        self,
        tp: TopicPartition,
        st: _PartitionState,
        result: partition_store_pb2.PartitionFetchResult,
    ) -> bool:
        """Buffers one partition's answer; True when metadata should be refreshed."""
        exc = error_from_proto(result.error)
        if exc is not None:
            if exc.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                strategy = self._default_reset()
                if strategy is None:
                    raise errors.error_for(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"offset {st.position} of {tp.topic}-{tp.partition} is out of range "
                        f"({exc.message}) and auto_offset_reset='none'",
                    )
                log.info("offset %s of %s out of range: resetting to %s",
                         st.position, tp, strategy)
                st.position = None
                st.reset = strategy
                return False
            if exc.retriable or exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self._back_off(st)
                return needs_metadata_refresh(exc)
            raise exc
        st.attempts = 0
        st.high_watermark = result.high_watermark
        st.last_stable_offset = result.last_stable_offset
        st.log_start_offset = result.log_start_offset
        position = st.position if st.position is not None else 0
        if result.batches:
            for batch in result.batches:
                if self._check_crcs:
                    try:
                        # Stored batches of compacted topics may have gaps.
                        codec.validate_batch(batch, max_size_bytes=len(batch), compacted=True)
                    except codec.BatchFormatError as bad:
                        raise errors.error_for(
                            ErrorCode.CORRUPT_MESSAGE,
                            f"fetched batch of {tp.topic}-{tp.partition} is corrupt: {bad}",
                        ) from None
            st.batches.extend(result.batches)
            st.next_fetch_offset = result.next_fetch_offset
            st.records = self._iter_buffered(st, position)
        elif result.next_fetch_offset > position:
            # Nothing to hand out, but the store skipped filtered batches.
            st.position = result.next_fetch_offset
        return False

    @staticmethod
    def _iter_buffered(st: _PartitionState, min_offset: int) -> Iterator[codec.Record]:
        while st.batches:
            batch = st.batches.popleft()
            if codec.read_header(batch).is_control:
                continue
            yield from codec.iter_records(batch, min_offset=min_offset)

    def _drain(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        tps = list(self._assignment.items())
        if not tps:
            return out
        # Start at a rotating partition, so one busy partition cannot starve the others.
        start = self._next_drain_index % len(tps)
        self._next_drain_index += 1
        for tp, st in tps[start:] + tps[:start]:
            if st.records is None:
                continue
            topic, partition = tp.topic, tp.partition
            append = out.append
            for record in st.records:
                append(ConsumerRecord(
                    topic, partition, record.offset, record.key, record.value,
                    record.headers, record.timestamp_ms,
                ))
                st.position = record.offset + 1
                if len(out) >= max_records:
                    break
            else:
                # Buffer used up: move past everything the fetch covered.
                if st.position is not None and st.next_fetch_offset > st.position:
                    st.position = st.next_fetch_offset
                st.clear_buffer()
            if len(out) >= max_records:
                break
        return out

    # ------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("the consumer is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fetch in self._in_flight.values():
            fetch.call.cancel()
        self._in_flight.clear()
        self._client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
