"""The consumer's fetcher: reading records from the stores.

`Fetcher` owns the Fetch requests in flight (at most one per store, kept
across polls), each store's backoff and throttle time, the metadata
refreshes a fetch needs, and the decoding of what was fetched: it checks
the batches (check_crcs), buffers them in the partition's
`_subscription.PartitionState`, and hands records out as
`ConsumerRecord`s (deserialized when the consumer has deserializers),
moving each partition's position as it goes, past batches the store
filtered out (aborted transactions under read_committed, control batches).
It also resets positions with ListOffsets (auto_offset_reset, seek_to_*)
and answers the consumer's offset queries.

It owns no partition: the assignment and positions are the
`SubscriptionState`'s, which it is given. Fetch answers arrive on gRPC
threads, which only call `wake`; everything else runs in the
application's thread, inside the consumer's calls.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc

from oncelog._client import (
    ClusterClient,
    backoff_ms,
    error_from_proto,
    is_security_error,
    needs_metadata_refresh,
    remaining_ms,
    unreachable_addresses,
)
from oncelog._subscription import (
    COMMITTED,
    EARLIEST,
    LATEST,
    PartitionState,
    SubscriptionState,
)
from oncelog._throttle import Throttles
from oncelog.errors import DeserializationError
from oncelog.serializers import Deserializer
from oncelog.types import ConsumerRecord, PartitionRecords, ThrottleTime, TopicPartition
from oncelog.v1 import partition_store_pb2, records_pb2
from oncelog.wire import errors
from oncelog.wire import records as codec
from oncelog.wire.errors import ErrorCode, OncelogError

# The consumer's logger: what the fetcher logs is the consumer's doing, and
# applications filter on that name.
log = logging.getLogger("oncelog.consumer")

_RESET_TIMESTAMPS: dict[str, int] = {EARLIEST: -2, LATEST: -1}


@dataclass(frozen=True, slots=True, eq=False)
class _InFlightFetch:
    address: str
    call: grpc.Future
    # The offset each partition was fetched from (PartitionState.fetch_offset):
    # an answer for a partition whose buffer no longer ends there (a seek, a
    # reset meanwhile) is dropped.
    offsets: dict[TopicPartition, int]


class Fetcher:
    """Fetches the subscription's partitions from their leaders, buffers
    and decodes the answers, and resolves position resets."""

    def __init__(
        self,
        client: ClusterClient,
        subscription: SubscriptionState,
        *,
        wake: Callable[[], None],
        client_id: str,
        isolation: records_pb2.IsolationLevel.ValueType,
        fetch_max_wait_ms: int,
        fetch_min_bytes: int,
        fetch_max_bytes: int,
        max_partition_fetch_bytes: int,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        retry_backoff_max_ms: int,
        check_crcs: bool,
        key_deserializer: Deserializer | None,
        value_deserializer: Deserializer | None,
    ) -> None:
        self._client = client
        self._subscription = subscription
        # Called on a gRPC thread when a fetch answers: poll() waits for it.
        self._wake = wake
        self._client_id = client_id
        self._isolation = isolation
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._fetch_min_bytes = fetch_min_bytes
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_backoff_max_ms = retry_backoff_max_ms
        self._check_crcs = check_crcs
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        # When each store asked to be fetched from no sooner (throttle times).
        self._throttles = Throttles("fetch")
        # Where the next fetch starts in the assignment (see send_fetches).
        self._fetch_rotation = 0
        self._in_flight: dict[str, _InFlightFetch] = {}
        self._node_retry_at_s: dict[str, float] = {}
        self._node_attempts: dict[str, int] = {}
        self._next_drain_index = 0
        self._last_refresh_s = 0.0
        # When poll() may ask for metadata again for partitions it has no
        # owner for (0.0: it need not).
        self._metadata_retry_at_s = 0.0
        # poll() logs a cluster that does not answer once, until it answers.
        self._unreachable_logged = False

    # ------------------------------------------------------------ waiting

    def has_answers(self) -> bool:
        """Whether a fetch in flight has answered (collect_fetches takes it)."""
        return any(f.call.done() for f in self._in_flight.values())

    def wake_times_s(self) -> list[float]:
        """When a backoff of the fetcher's ends (a store's, a metadata
        refresh's, a throttle time's), as time.monotonic() values: poll()
        wakes then to fetch again."""
        times = list(self._node_retry_at_s.values())
        times.append(self._metadata_retry_at_s)
        released_ms = self._throttles.next_release_ms(_monotonic_ms())
        if released_ms is not None:
            times.append(released_ms / 1000)
        return times

    @property
    def throttle_time(self) -> ThrottleTime:
        return self._throttles.totals()

    def close(self) -> None:
        """Cancels the fetches in flight."""
        for fetch in self._in_flight.values():
            fetch.call.cancel()
        self._in_flight.clear()

    # ------------------------------------------------------------ fetching

    def send_fetches(self, deadline_s: float) -> None:
        """Sends a Fetch to each store that owns partitions ready to be
        fetched and has none in flight; asks for metadata first (by
        deadline_s) when a partition's owner is not known, and then fetches
        in the same call, so that the first poll() does not wait for a
        fetch that was never sent."""
        # Each fetch starts one partition further on, as Kafka's consumer
        # rotates them: only the first partition with data may exceed what
        # is left of the request's max_bytes, so a fixed order could leave a
        # later partition's large batch out of every answer.
        states = self._subscription.items()
        if states:
            self._fetch_rotation = (self._fetch_rotation + 1) % len(states)
            states = states[self._fetch_rotation:] + states[:self._fetch_rotation]
        by_address, missing_leader = self._fetches_to_send(states)
        self._metadata_retry_at_s = 0.0
        if missing_leader:
            if self._refresh_metadata_for_fetch(deadline_s):
                by_address, missing_leader = self._fetches_to_send(states)
            if missing_leader:
                self._metadata_retry_at_s = self._last_refresh_s + self._retry_backoff_ms / 1000
        md = self._client.cached_metadata
        for address, offsets in by_address.items():
            request = partition_store_pb2.FetchRequest(
                partitions=[
                    partition_store_pb2.FetchPartition(
                        topic=tp.topic, partition=tp.partition, fetch_offset=offset,
                        max_bytes=self._max_partition_fetch_bytes,
                        current_leader_epoch=(
                            md.leader_epoch(tp.topic, tp.partition) if md else None),
                    )
                    for tp, offset in offsets.items()
                ],
                max_wait_ms=self._fetch_max_wait_ms,
                min_bytes=self._fetch_min_bytes,
                max_bytes=self._fetch_max_bytes,
                isolation_level=self._isolation,
                client_id=self._client_id,
            )
            # In flight across polls: poll() never waits on it longer than
            # its own timeout, so its deadline can be a generous one.
            timeout_s = (self._fetch_max_wait_ms + self._request_timeout_ms) / 1000
            try:
                call = self._client.store(address).Fetch.future(request, timeout=timeout_s)
            except (OncelogError, ValueError, RuntimeError) as exc:
                log.debug("cannot fetch from %s: %s", address, exc)
                self._back_off_node(address)
                continue
            self._in_flight[address] = _InFlightFetch(address, call, offsets)
            call.add_done_callback(self._on_fetch_done)

    def _fetches_to_send(
        self, states: list[tuple[TopicPartition, PartitionState]]
    ) -> tuple[dict[str, dict[TopicPartition, int]], bool]:
        """The partitions to fetch now, by owner's address, and whether some
        partition ready to be fetched has no known owner."""
        now_s = time.monotonic()
        now_ms = _monotonic_ms()
        md = self._client.cached_metadata
        by_address: dict[str, dict[TopicPartition, int]] = {}
        missing_leader = False
        for tp, st in states:
            # A partition with records buffered is fetched again ahead of
            # need (from where its buffer ends) once less than one fetch's
            # worth is left unread, so that the next records are on their
            # way while the application works on these: a consumer that
            # fetched only an empty partition would wait a whole round trip
            # after every buffer it hands out. At most about two fetches'
            # worth is buffered per partition.
            offset = st.fetch_offset
            if (offset is None or now_s < st.retry_at_s
                    or st.unread_bytes() >= self._max_partition_fetch_bytes):
                continue
            address = md.leader_address(tp.topic, tp.partition) if md is not None else None
            if address is None:
                missing_leader = True
                continue
            if address in self._in_flight or now_s < self._node_retry_at_s.get(address, 0.0):
                continue
            if self._throttles.held_until_ms(address, now_ms) is not None:
                continue  # the store throttles this consumer (its quota)
            by_address.setdefault(address, {})[tp] = offset
        return by_address, missing_leader

    def _on_fetch_done(self, _call: grpc.Future) -> None:
        self._wake()

    def _refresh_metadata_for_fetch(self, deadline_s: float) -> bool:
        """Asks for metadata again, at most once per retry_backoff_ms, by
        deadline_s; True when it got an answer. Raises
        UnknownTopicOrPartitionError for an assigned partition that does not
        exist, unless the group assigned it (group_is_ahead: waited for)."""
        now_s = time.monotonic()
        if (now_s - self._last_refresh_s) * 1000 < self._retry_backoff_ms:
            return False
        self._last_refresh_s = now_s
        budget_ms = remaining_ms(deadline_s)
        if budget_ms <= 0:
            return False
        try:
            md = self._client.refresh_metadata(timeout_ms=budget_ms)
        except OncelogError as exc:
            if is_security_error(exc):
                raise  # the cluster refuses us: retrying changes nothing
            self._log_unreachable(exc, "metadata")
            return False
        self._unreachable_logged = False
        for tp in self._subscription.partitions():
            info = md.topics.get(tp.topic)
            if info is None:
                refusal = self._client.topic_refusal(tp.topic,
                                                     timeout_ms=remaining_ms(deadline_s))
                if refusal is not None:
                    raise refusal
            if info is None or tp.partition >= info.num_partitions:
                missing = errors.error_for(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"assigned partition {tp.topic}-{tp.partition} does not exist"
                    + ("" if info is None else f" (the topic has {info.num_partitions})"),
                )
                if not self._subscription.group_is_ahead(missing):
                    raise missing
        return True

    def _log_unreachable(self, exc: OncelogError, what: str) -> None:
        """poll() returns nothing rather than raise when the cluster does not
        answer (as Kafka's does); it says so in the log, once until it
        answers again, naming the addresses."""
        if unreachable_addresses(exc) and not self._unreachable_logged:
            self._unreachable_logged = True
            log.warning("poll() could not get %s: %s", what, exc)
        else:
            log.debug("poll() could not get %s: %s", what, exc)

    def _back_off_node(self, address: str) -> None:
        attempts = self._node_attempts.get(address, 0) + 1
        self._node_attempts[address] = attempts
        self._node_retry_at_s[address] = time.monotonic() + backoff_ms(
            attempts, base_ms=self._retry_backoff_ms, max_ms=self._retry_backoff_max_ms
        ) / 1000

    def collect_fetches(self, deadline_s: float) -> None:
        """Takes the answers of finished fetches into the partition buffers;
        asks for metadata again (by deadline_s) when one says an owner moved."""
        refresh = False
        for address, fetch in list(self._in_flight.items()):
            if not fetch.call.done():
                continue
            del self._in_flight[address]
            try:
                resp = fetch.call.result()
            except grpc.RpcError as rpc_exc:
                exc = self._client.rpc_error(rpc_exc, address)
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
            self._client.note_answered(address)
            self._throttles.answered(address, resp.throttle_time_ms, _monotonic_ms())
            for result in resp.results:
                tp = TopicPartition(result.topic, result.partition)
                st = self._subscription.get(tp)
                fetched_from = fetch.offsets.get(tp)
                if st is None or fetched_from is None or st.fetch_offset != fetched_from:
                    continue  # unassigned or moved by seek() meanwhile
                take = self._take_ahead if st.has_buffered else self._take_result
                refresh = take(tp, st, result) or refresh
        if refresh:
            self._refresh_metadata_for_fetch(deadline_s)

    def _take_result(
        self,
        tp: TopicPartition,
        st: PartitionState,
        result: partition_store_pb2.PartitionFetchResult,
    ) -> bool:
        """Buffers one partition's answer; True when metadata should be refreshed."""
        exc = error_from_proto(result.error)
        if exc is not None:
            if exc.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                strategy = self._subscription.default_reset()
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
                self._subscription.back_off(st)
                return needs_metadata_refresh(exc)
            raise exc
        _note_answer(st, result)
        position = st.position if st.position is not None else 0
        if result.batches:
            self._check_batches(tp, result)
            st.batches.extend(result.batches)
            st.next_fetch_offset = result.next_fetch_offset
            st.records = codec.iter_buffered_fields(st.batches, position)
        elif result.next_fetch_offset > position:
            # Nothing to hand out, but the store skipped filtered batches.
            st.position = result.next_fetch_offset
        return False

    def _take_ahead(self, tp: TopicPartition, st: PartitionState,
                    result: partition_store_pb2.PartitionFetchResult) -> bool:
        """Appends the answer of a fetch ahead to the partition's buffer;
        True when metadata should be refreshed.

        An error is left for the fetch from the position to meet and act on
        (an offset out of range there is the application's concern, not
        one of records it has not reached): until then the partition only
        backs off."""
        exc = error_from_proto(result.error)
        if exc is not None:
            self._subscription.back_off(st)
            return exc.retriable and needs_metadata_refresh(exc)
        _note_answer(st, result)
        self._check_batches(tp, result)
        st.batches.extend(result.batches)
        st.next_fetch_offset = max(st.next_fetch_offset, result.next_fetch_offset)
        return False

    def _check_batches(self, tp: TopicPartition,
                       result: partition_store_pb2.PartitionFetchResult) -> None:
        """Raises CorruptMessageError for a fetched batch that fails its
        checks (check_crcs)."""
        if not self._check_crcs:
            return
        for batch in result.batches:
            try:
                # Stored batches of compacted topics may have gaps.
                codec.validate_batch(batch, max_size_bytes=len(batch), compacted=True)
            except codec.BatchFormatError as bad:
                raise errors.error_for(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"fetched batch of {tp.topic}-{tp.partition} is corrupt: {bad}",
                ) from None

    # ------------------------------------------------------------ handing out

    def _drain_order(self) -> list[tuple[TopicPartition, PartitionState]]:
        """The assigned partitions, starting at the next one in turn, so
        that one busy partition cannot starve the others."""
        tps = self._subscription.items()
        if not tps:
            return tps
        start = self._next_drain_index % len(tps)
        self._next_drain_index += 1
        return tps[start:] + tps[:start]

    def drain(self, max_records: int,
              only: frozenset[TopicPartition] | None = None) -> list[ConsumerRecord]:
        """Up to max_records buffered records (of the partitions `only`
        names, default all), moving each partition's position past what it
        hands out."""
        out: list[ConsumerRecord] = []
        tps = self._drain_order()
        if self.deserializes:
            return self._drain_deserialized(tps, max_records, only)
        for tp, st in tps:
            if st.records is None or (only is not None and tp not in only):
                continue
            taken, ran_out = codec.take_records(st.records, max_records - len(out),
                                                tp.topic, tp.partition, ConsumerRecord)
            if taken:
                st.position = taken[-1].offset + 1
                out += taken
            if ran_out:
                st.finish_buffer()  # after the position: it may move it further
            if len(out) >= max_records:
                break
        return out

    @property
    def deserializes(self) -> bool:
        """Whether the consumer has a key or a value deserializer."""
        return self._key_deserializer is not None or self._value_deserializer is not None

    def drain_columns(self, max_records: int,
                      only: frozenset[TopicPartition] | None = None) -> list[PartitionRecords]:
        """drain() as columns, one PartitionRecords per partition with
        records (Consumer.poll_columns): the same records, in the same
        rotation, moving the same positions. Without deserializers only."""
        out: list[PartitionRecords] = []
        left = max_records
        for tp, st in self._drain_order():
            if st.records is None or (only is not None and tp not in only):
                continue
            (offsets, timestamps_ms, keys, values, headers), ran_out = codec.take_columns(
                st.records, left)
            if offsets:
                st.position = offsets[-1] + 1
            if ran_out:
                st.finish_buffer()  # after the position: it may move it further
            if offsets:
                out.append(PartitionRecords(tp.topic, tp.partition, offsets, timestamps_ms,
                                            keys, values, headers))
                left -= len(offsets)
                if left <= 0:
                    break
        return out

    def _drain_deserialized(self, tps: list[tuple[TopicPartition, PartitionState]],
                            max_records: int, only: frozenset[TopicPartition] | None,
                            ) -> list[ConsumerRecord]:
        """drain with deserializers (kept apart so the plain path stays
        lean). A record a deserializer fails on is put back in front of its
        partition's buffer and the position stays at it: the records before
        it are returned, and the next drain that meets it first raises
        DeserializationError (Kafka's consumer does the same)."""
        out: list[ConsumerRecord] = []
        key_deserializer, value_deserializer = self._key_deserializer, self._value_deserializer
        new_tuple = tuple.__new__
        for tp, st in tps:
            records = st.records
            if records is None or (only is not None and tp not in only):
                continue
            topic, partition = tp.topic, tp.partition
            for record in records:
                offset, timestamp_ms, key, value, headers = record
                which = "key"
                try:
                    if key is not None and key_deserializer is not None:
                        key = key_deserializer(key)
                    which = "value"
                    if value is not None and value_deserializer is not None:
                        value = value_deserializer(value)
                except Exception as exc:
                    st.records = itertools.chain((record,), records)
                    if out:
                        return out
                    raw = new_tuple(ConsumerRecord, (
                        topic, partition, offset, record[2], record[3], headers, timestamp_ms,
                    ))
                    raise DeserializationError(
                        f"the {which} of the record at offset {offset} of "
                        f"{topic}-{partition} could not be deserialized: "
                        f"{type(exc).__name__}: {exc} (the position stays there; "
                        f"seek(TopicPartition({topic!r}, {partition}), {offset + 1}) "
                        "skips it)",
                        topic=topic, partition=partition, offset=offset, record=raw,
                    ) from exc
                out.append(new_tuple(ConsumerRecord, (
                    topic, partition, offset, key, value, headers, timestamp_ms,
                )))
                st.position = offset + 1
                if len(out) >= max_records:
                    break
            else:
                st.finish_buffer()
            if len(out) >= max_records:
                break
        return out

    # ------------------------------------------------------------ offsets

    def reset_positions(
        self, tps: list[TopicPartition], *, now_s: float, deadline_s: float,
        raise_errors: bool,
    ) -> None:
        """Sets the position of partitions waiting for a reset (earliest or
        latest) with ListOffsets, by deadline_s; those waiting for the
        group's committed offset are the consumer's. With raise_errors
        False (poll), a partition still in its backoff at now_s is left
        for later, and a failure leaves them unresolved, to be tried again
        on a later poll (after a backoff)."""
        wanted: dict[TopicPartition, int] = {}
        subscription = self._subscription
        for tp in tps:
            st = subscription.state(tp)
            if st.position is not None or st.reset == COMMITTED:
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
            answers = self.list_offsets(wanted, budget_ms=remaining_ms(deadline_s))
        except OncelogError as exc:
            if raise_errors or not (exc.retriable or subscription.group_is_ahead(exc)):
                raise
            for tp in wanted:
                subscription.back_off(subscription.state(tp))
            if exc.retriable:
                self._log_unreachable(exc, "a position reset")
            return
        for tp, (offset, _ts) in answers.items():
            resolved = subscription.get(tp)
            if resolved is not None and resolved.position is None:
                resolved.position = max(offset, 0)
                resolved.reset = None
                resolved.attempts = 0

    def list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        budget_ms: int,
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets for each partition at its owner, with retries, within
        budget_ms (metadata lookups included)."""
        pending = dict(timestamps)
        for tp in pending:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartition values, got {tp!r}")
        answers: dict[TopicPartition, tuple[int, int]] = {}
        client = self._client

        def attempt(timeout_s: float) -> dict[TopicPartition, tuple[int, int]]:
            # The lookups and the requests below share this attempt's time.
            deadline_s = time.monotonic() + timeout_s
            by_address: dict[str, list[TopicPartition]] = {}
            for tp in pending:
                address = client.leader(tp.topic, tp.partition, timeout_ms=remaining_ms(deadline_s))
                by_address.setdefault(address, []).append(tp)
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
                try:
                    resp = client.store(address).ListOffsets(
                        request, timeout=max(deadline_s - time.monotonic(), 0.001)
                    )
                except grpc.RpcError as rpc_exc:
                    raise client.rpc_error(rpc_exc, address) from rpc_exc
                client.note_answered(address)
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

        return client.call("ListOffsets", attempt, timeout_ms=budget_ms)


def _note_answer(st: PartitionState,
                 result: partition_store_pb2.PartitionFetchResult) -> None:
    """What every answer without an error tells of a partition's log."""
    st.attempts = 0
    st.high_watermark = result.high_watermark
    st.last_stable_offset = result.last_stable_offset
    st.log_start_offset = result.log_start_offset


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000
