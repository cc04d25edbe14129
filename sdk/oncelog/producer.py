"""The producer: batching, pipelined sends, idempotent retries.

`send()` appends the record to its partition's open batch and returns a future
at once. A background sender thread takes batches when they are full, when
they have waited `linger_ms`, or on `flush()`; gives each its sequence number
(idempotence); encodes it once; groups the batches by store node into one
Produce request per node, up to `max_in_flight` unacknowledged batches per
partition; and resolves each batch's futures when its answer comes. Retries
re-send the identical bytes, so the store's deduplication makes a retry after
a lost answer harmless. See docs/sdk.md for the guarantees and
`_sequencing.py` for the retry rules.

Transactions arrive in a later version: the sender already keeps the producer
id, epoch and per-partition sequences in one place (`_Sender`), where a
client-side transaction state machine will hook in (AddPartitionsToTxn before a
partition's first transactional batch, EndTxn after a flush).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from oncelog import errors
from oncelog._batching import (
    BATCH_OVERHEAD_BYTES,
    FINISHED,
    RECORD_OVERHEAD_BYTES,
    ProducerBatch,
    RecordAccumulator,
    RecordFuture,
    failed_future,
    record_size_bytes,
)
from oncelog._client import (
    MAX_GRPC_MESSAGE_BYTES,
    ClusterClient,
    backoff_ms,
    error_from_proto,
    needs_metadata_refresh,
    translate_rpc_error,
)
from oncelog._partitioner import StickyPartitioner, partition_for_key
from oncelog._sequencing import PartitionMode, PartitionSequencer
from oncelog.errors import ErrorCode, OncelogError
from oncelog.records import Header
from oncelog.v1 import coordinator_pb2, partition_store_pb2

log = logging.getLogger("oncelog.producer")

# Producer epochs are int16 on the wire; past this the producer needs a new id.
MAX_PRODUCER_EPOCH = 2**15 - 1
# Kafka's limit for an idempotent producer: the store deduplicates against the
# producer's last five batches per partition.
MAX_IN_FLIGHT_IDEMPOTENT = 5
# One Produce request carries at most this many bytes of batches (headroom
# under the gRPC message limit for the request's own fields).
MAX_REQUEST_BYTES = MAX_GRPC_MESSAGE_BYTES // 2
# How often the sender looks for batches past their delivery deadline.
EXPIRY_CHECK_INTERVAL_MS = 50
# The longest the sender sleeps while anything is incomplete (housekeeping).
MAX_SENDER_SLEEP_MS = 100


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"{what} must be bytes (or None), got {type(value).__name__}; "
        f"encode it first, e.g. value.encode()"
    )


def _check_headers(headers: Sequence[Header] | Mapping[str, bytes | None]) -> tuple[Header, ...]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"a header must be a (str, bytes | None) pair, got {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, got {type(hkey).__name__}")
        if hvalue is not None and type(hvalue) is not bytes:
            hvalue = _as_bytes(hvalue, f"value of header {hkey!r}")
        out.append((hkey, hvalue))
    return tuple(out)


class Producer:
    """Sends records to topics; idempotent by default.

    Thread-safe: any number of threads may call send() concurrently.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        transactional_id: str | None = None,
        enable_idempotence: bool = True,
        linger_ms: int = 5,
        batch_size: int = 16384,
        max_in_flight: int = 5,
        transaction_timeout_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        buffer_memory_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
    ) -> None:
        if transactional_id is not None:
            raise errors.error_for(
                ErrorCode.UNSUPPORTED_VERSION,
                "transactions (transactional_id) are not available in this version of the "
                "oncelog SDK; leave transactional_id=None for an idempotent producer",
            )
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if enable_idempotence and max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT:
            raise ValueError(
                f"an idempotent producer allows at most {MAX_IN_FLIGHT_IDEMPOTENT} batches in "
                f"flight per partition (the store deduplicates against the last "
                f"{MAX_IN_FLIGHT_IDEMPOTENT}), got max_in_flight={max_in_flight}"
            )
        if delivery_timeout_ms <= 0 or max_block_ms < 0 or buffer_memory_bytes <= 0:
            raise ValueError(
                "delivery_timeout_ms and buffer_memory_bytes must be positive and "
                "max_block_ms >= 0"
            )
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
        )
        self._enable_idempotence = enable_idempotence
        self._buffer_memory_bytes = buffer_memory_bytes
        self._max_block_ms = max_block_ms
        self._accumulator = RecordAccumulator(
            batch_size_bytes=batch_size, linger_ms=linger_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            buffer_memory_bytes=buffer_memory_bytes,
            sticky=StickyPartitioner(random.Random()),
            clock_ms=_now_ms,
        )
        # topic -> (number of partitions, max.message.bytes), valid for one
        # metadata version.
        self._topics: dict[str, tuple[int, int]] = {}
        self._topics_version = -1
        self._closed = False
        self._close_lock = threading.Lock()
        self._sender = _Sender(
            client=self._client, accumulator=self._accumulator,
            idempotent=enable_idempotence, max_in_flight=max_in_flight,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            transaction_timeout_ms=transaction_timeout_ms,
        )
        self._sender.start()

    # ------------------------------------------------------------------ API

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queues a record; returns a future of its RecordMetadata.

        Bad arguments raise TypeError/ValueError here; anything about the
        cluster (unknown topic or partition, record over the topic's
        max.message.bytes, delivery failures) fails the future instead.
        """
        if self._closed:
            raise errors.IllegalStateError("send() on a closed producer")
        fatal = self._sender.fatal_error
        if fatal is not None:
            return failed_future(topic, -1 if partition is None else partition, fatal)
        # The size is computed inline for the common case: this is the hot path.
        size = RECORD_OVERHEAD_BYTES
        if value is not None:
            if type(value) is not bytes:
                value = _as_bytes(value, "value")
            size += len(value)
        if key is not None:
            if type(key) is not bytes:
                key = _as_bytes(key, "key")
            size += len(key)
        header_tuple: tuple[Header, ...] | None = None
        if headers:
            header_tuple = _check_headers(headers)
            size = record_size_bytes(key, value, header_tuple)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative int, got {timestamp_ms!r}")

        client = self._client
        # The private field, not the property: this runs once per record.
        if self._topics_version != client._metadata_version:
            self._topics.clear()
            self._topics_version = client._metadata_version
        info = self._topics.get(topic)
        if info is None:
            if not isinstance(topic, str) or not topic:
                raise TypeError(f"topic must be a non-empty str, got {topic!r}")
            try:
                tinfo = client.topic(topic)
            except OncelogError as exc:
                return failed_future(topic, -1 if partition is None else partition, exc)
            info = (tinfo.num_partitions, tinfo.max_message_bytes)
            self._topics[topic] = info
        num_partitions, max_message_bytes = info

        if partition is None:
            if key is not None:
                partition = partition_for_key(key, num_partitions)
        elif type(partition) is not int:
            raise TypeError(f"partition must be an int or None, got {partition!r}")
        elif not 0 <= partition < num_partitions:
            return failed_future(topic, partition, errors.error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has partitions 0..{num_partitions - 1}, "
                f"no partition {partition}",
            ))
        if size + BATCH_OVERHEAD_BYTES > max_message_bytes:
            return failed_future(topic, -1 if partition is None else partition, errors.error_for(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"record is {size + BATCH_OVERHEAD_BYTES} bytes encoded (as a batch of one), "
                f"over max.message.bytes={max_message_bytes} of topic {topic!r}",
            ))
        acc = self._accumulator
        # acquire/release costs half of a `with` block, which shows at 250k calls/s.
        acc.lock.acquire()
        try:
            if acc.buffered_bytes + size > self._buffer_memory_bytes and acc.buffered_bytes:
                blocked = self._wait_for_buffer(size)
                if blocked is not None:
                    return failed_future(topic, -1 if partition is None else partition, blocked)
            return acc.append(
                topic, partition, num_partitions, (key, value, header_tuple, timestamp_ms),
                size, max_message_bytes,
            )
        finally:
            acc.lock.release()

    def _wait_for_buffer(self, size: int) -> OncelogError | None:
        """Blocks (up to max_block_ms) until buffered records leave room for
        `size` more bytes. Caller holds the accumulator lock."""
        acc = self._accumulator
        deadline_s = time.monotonic() + self._max_block_ms / 1000
        while acc.buffered_bytes + size > self._buffer_memory_bytes and acc.buffered_bytes:
            if self._closed or self._sender.fatal_error is not None:
                return self._sender.fatal_error or errors.IllegalStateError("producer closed")
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return errors.KafkaTimeoutError(
                    f"buffer_memory_bytes={self._buffer_memory_bytes} stayed full for "
                    f"max_block_ms={self._max_block_ms}: records are not being delivered "
                    f"as fast as they are sent"
                )
            acc.changed.wait(remaining_s)
        return None

    def flush(self, timeout: float | None = None) -> None:
        """Sends every queued record now and waits until each one sent before
        this call is acknowledged or failed. `timeout` in seconds."""
        if threading.current_thread() is self._sender.thread:
            raise errors.IllegalStateError(
                "flush() from a future's callback would wait for itself"
            )
        acc = self._accumulator
        pending = deque(sorted(acc.begin_flush(), key=lambda b: b.created_ms))
        try:
            deadline_s = None if timeout is None else time.monotonic() + timeout
            with acc.lock:
                while pending:
                    if pending[0].state == FINISHED:
                        pending.popleft()
                        continue
                    wait_s = None
                    if deadline_s is not None:
                        wait_s = deadline_s - time.monotonic()
                        if wait_s <= 0:
                            raise errors.KafkaTimeoutError(
                                f"flush() timed out after {timeout} s with "
                                f"{len(pending)} batches not yet acknowledged"
                            )
                    acc.changed.wait(wait_s)
        finally:
            acc.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Delivers what is queued (waiting up to `timeout` seconds, None: as
        long as it takes), then stops the sender; records still undelivered at
        the timeout fail with KafkaTimeoutError."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._sender.close(timeout)
        finally:
            self._client.close()

    @property
    def producer_id(self) -> int:
        """The producer id from the coordinator (-1 before the first send, or
        without idempotence)."""
        return self._sender.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._sender.producer_epoch

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Sender:
    """The producer's background thread: drains, numbers, sends, completes.

    Everything here except the completion queue and `fatal_error` is owned by
    the sender thread; gRPC callbacks only append to the completion queue
    (under the accumulator's lock) and wake the thread.
    """

    def __init__(
        self,
        *,
        client: ClusterClient,
        accumulator: RecordAccumulator,
        idempotent: bool,
        max_in_flight: int,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        retry_backoff_max_ms: int,
        transaction_timeout_ms: int,
    ) -> None:
        self._client = client
        self._acc = accumulator
        self._idempotent = idempotent
        self._max_in_flight = max_in_flight
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_backoff_max_ms = retry_backoff_max_ms
        self._transaction_timeout_ms = transaction_timeout_ms
        self._sequencers: dict[tuple[str, int], PartitionSequencer] = {}
        # Partitions with unacknowledged batches or a pending retry/reset.
        self._active: set[tuple[str, int]] = set()
        self._completions: list[tuple[list[ProducerBatch], grpc.Future]] = []
        self._requests_in_flight = 0
        self.producer_id = -1
        self.producer_epoch = -1
        self.fatal_error: OncelogError | None = None
        self._pid_attempts = 0
        self._pid_retry_at_ms = 0
        self._pid_last_error: OncelogError | None = None
        self._coordinator_index = random.randrange(1 << 16)
        self._next_expiry_check_ms = 0
        self._force_close = False
        self.thread = threading.Thread(target=self._run, name="oncelog-producer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout: float | None) -> None:
        acc = self._acc
        with acc.lock:
            acc.closing = True
            acc.wakeup.notify()
            acc.woken = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            with acc.lock:
                self._force_close = True
                acc.wakeup.notify()
                acc.woken = True
            self.thread.join()

    # ------------------------------------------------------------ main loop

    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except Exception as exc:  # a bug: fail every record instead of hanging
            log.exception("producer sender thread crashed")
            self._abort_all(errors.error_for(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"producer sender thread crashed: {exc!r}"
            ))
            with self._acc.lock:
                self.fatal_error = errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR, f"producer sender thread crashed: {exc!r}"
                )

    def _loop_once(self) -> bool:
        """One round; False when the sender is done."""
        now = _now_ms()
        self._process_completions(now)
        if self._force_close:
            self._abort_all(errors.KafkaTimeoutError(
                "the producer was closed before the record was acknowledged"
            ))
            return False
        if self.fatal_error is not None:
            self._abort_all(self.fatal_error)
        elif (
            self._idempotent and self.producer_id < 0
            and now >= self._pid_retry_at_ms and self._acc.incomplete_count
        ):
            self._init_producer_id(now)
        self._reset_sequences_if_needed(now)
        if now >= self._next_expiry_check_ms:
            self._expire(now)
            self._next_expiry_check_ms = now + EXPIRY_CHECK_INTERVAL_MS
        wake_at_ms = self._send_ready(now)
        acc = self._acc
        with acc.lock:
            if acc.closing and not acc.incomplete and not self._requests_in_flight:
                return False
            if acc.woken or self._completions:
                acc.woken = False
                return True
            if acc.incomplete:
                limit = now + MAX_SENDER_SLEEP_MS
                wake_at_ms = limit if wake_at_ms is None else min(wake_at_ms, limit)
            timeout_s = None if wake_at_ms is None else max(0.0, (wake_at_ms - now) / 1000)
            acc.wakeup.wait(timeout_s)
            acc.woken = False
        return True

    # ------------------------------------------------------------ producer id

    def _init_producer_id(self, now: int) -> bool:
        """One InitProducerId attempt (empty transactional id: a fresh producer
        id, epoch 0) against a coordinator; on a retriable failure, the next
        attempt waits for a backoff (queued batches expire meanwhile at their
        delivery deadline)."""
        self._pid_attempts += 1
        try:
            md = self._client.cached_metadata or self._client.refresh_metadata()
            if not md.coordinators:
                self._set_fatal(errors.error_for(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "the cluster has no transaction coordinator to hand out producer ids; "
                    "an idempotent producer needs one (or use enable_idempotence=False)",
                ))
                return False
            address = md.coordinators[self._coordinator_index % len(md.coordinators)]
            request = coordinator_pb2.InitProducerIdRequest(
                transactional_id="",
                transaction_timeout_ms=self._transaction_timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            )
            try:
                resp = self._client.coordinator(address).InitProducerId(
                    request, timeout=self._request_timeout_ms / 1000
                )
            except grpc.RpcError as rpc_exc:
                raise translate_rpc_error(rpc_exc) from None
            exc = error_from_proto(resp.error)
            if exc is not None:
                raise exc
        except OncelogError as exc:
            self._pid_last_error = exc
            if not exc.retriable:
                self._set_fatal(exc)
                return False
            self._coordinator_index += 1
            self._pid_retry_at_ms = now + backoff_ms(
                self._pid_attempts, base_ms=self._retry_backoff_ms,
                max_ms=self._retry_backoff_max_ms,
            )
            if needs_metadata_refresh(exc):
                self._client.request_metadata_refresh()
            log.debug("InitProducerId failed (attempt %d): %s", self._pid_attempts, exc)
            return False
        self.producer_id = resp.producer_id
        self.producer_epoch = resp.producer_epoch
        self._pid_attempts = 0
        self._pid_last_error = None
        log.debug("producer id %d epoch %d", self.producer_id, self.producer_epoch)
        return True

    def _set_fatal(self, exc: OncelogError) -> None:
        with self._acc.lock:
            self.fatal_error = exc
        self._abort_all(exc)

    def _reset_sequences_if_needed(self, now: int) -> None:
        """Partitions whose sequence broke need the producer on a newer epoch
        than the one they used; bump it (locally, as Kafka's idempotent producer
        does: the store accepts a higher epoch starting at sequence 0) or, when
        the epoch is exhausted, get a new producer id, then renumber."""
        needing = [s for s in self._sequencers.values() if s.mode is PartitionMode.NEEDS_RESET]
        if not needing:
            return
        current = (self.producer_id, self.producer_epoch)
        if any((s.producer_id, s.producer_epoch) == current for s in needing):
            if self.producer_epoch < MAX_PRODUCER_EPOCH:
                self.producer_epoch += 1
                log.info(
                    "producer %d bumps its epoch to %d after a failed batch",
                    self.producer_id, self.producer_epoch,
                )
            elif now < self._pid_retry_at_ms or not self._init_producer_id(now):
                return
        for seq in needing:
            seq.reset_sequences(producer_id=self.producer_id, producer_epoch=self.producer_epoch)

    # ------------------------------------------------------------ sending

    def _sequencer(self, key: tuple[str, int]) -> PartitionSequencer:
        seq = self._sequencers.get(key)
        if seq is None:
            seq = self._sequencers[key] = PartitionSequencer(
                idempotent=self._idempotent, max_in_flight=self._max_in_flight,
                retry_backoff_ms=self._retry_backoff_ms,
                retry_backoff_max_ms=self._retry_backoff_max_ms,
            )
        return seq

    def _send_ready(self, now: int) -> int | None:
        """Takes sendable batches from the accumulator, sends what the
        partitions allow; returns when something next becomes due."""
        ready, wake_at = self._acc.ready_partitions(now)
        can_assign = self.fatal_error is None and (
            not self._idempotent or self.producer_id >= 0
        )
        md = self._client.cached_metadata
        if can_assign:
            for key in ready:
                seq = self._sequencer(key)
                info = md.topics.get(key[0]) if md is not None else None
                num_partitions = info.num_partitions if info is not None else 1
                while seq.can_take_new():
                    batch = self._acc.pop(key, now, num_partitions)
                    if batch is None:
                        break
                    seq.assign(batch, producer_id=self.producer_id,
                               producer_epoch=self.producer_epoch)
                    self._active.add(key)

        # Request i to a node carries the i-th batch to send of each partition,
        # so batches of one partition go out in order, one per request.
        by_address: dict[str, list[list[ProducerBatch]]] = {}
        finished: list[tuple[ProducerBatch, int, BaseException | None]] = []
        for key in list(self._active):
            seq = self._sequencers[key]
            batches = seq.batches_to_send(now)
            if not batches:
                if seq.idle:
                    self._active.discard(key)
                elif seq.in_flight_count == 0 and seq.mode in (
                    PartitionMode.RETRYING, PartitionMode.UNRESOLVED
                ):
                    wake_at = seq.retry_at_ms if wake_at is None else min(wake_at, seq.retry_at_ms)
                continue
            address = md.leader_address(*key) if md is not None else None
            if address is None:
                exc = errors.error_for(
                    ErrorCode.LEADER_NOT_AVAILABLE,
                    f"no store known for partition {key[0]}-{key[1]}",
                )
                for batch in batches:
                    self._on_batch_error(seq, batch, exc, now, finished, dispatched=False)
                self._client.request_metadata_refresh()
                continue
            slots = by_address.setdefault(address, [])
            for i, batch in enumerate(batches):
                if len(slots) <= i:
                    slots.append([])
                slots[i].append(batch)
        self._complete(finished)
        for address, slots in by_address.items():
            for batches in slots:
                self._dispatch(address, batches, now)
        return wake_at

    def _dispatch(self, address: str, batches: list[ProducerBatch], now: int) -> None:
        """Sends batches (distinct partitions) to one store, in requests of at
        most MAX_REQUEST_BYTES."""
        chunk: list[ProducerBatch] = []
        chunk_bytes = 0
        for batch in batches:
            size = len(batch.data or b"")
            if chunk and chunk_bytes + size > MAX_REQUEST_BYTES:
                self._send_request(address, chunk, now)
                chunk, chunk_bytes = [], 0
            chunk.append(batch)
            chunk_bytes += size
        if chunk:
            self._send_request(address, chunk, now)

    def _send_request(self, address: str, batches: list[ProducerBatch], now: int) -> None:
        request = partition_store_pb2.ProduceRequest(
            batches=[
                partition_store_pb2.PartitionBatch(
                    topic=b.topic, partition=b.partition, batch=b.data or b"",
                )
                for b in batches
            ],
            timeout_ms=self._request_timeout_ms,
        )
        # The attempt may not outlive the latest delivery deadline among its
        # batches (a cut-short attempt counts as "outcome unknown").
        latest_deadline = max(b.deadline_ms for b in batches)
        timeout_ms = min(self._request_timeout_ms + 1000, max(latest_deadline - now, 50))
        try:
            call = self._client.store(address).Produce.future(request, timeout=timeout_ms / 1000)
        except (OncelogError, ValueError, RuntimeError) as exc:
            # The client is closed or the channel is unusable: fail this attempt.
            failure = errors.error_for(
                ErrorCode.NETWORK_EXCEPTION, f"cannot send to {address}: {exc}"
            )
            finished: list[tuple[ProducerBatch, int, BaseException | None]] = []
            for batch in batches:
                self._on_batch_error(self._seq_of(batch), batch, failure, now, finished,
                                     dispatched=False)
            self._complete(finished)
            return
        self._requests_in_flight += 1
        call.add_done_callback(functools.partial(self._on_rpc_done, batches))

    def _on_rpc_done(self, batches: list[ProducerBatch], call: grpc.Future) -> None:
        # A gRPC thread: only hand the answer over to the sender thread.
        acc = self._acc
        with acc.lock:
            self._completions.append((batches, call))
            acc.woken = True
            acc.wakeup.notify()

    # ------------------------------------------------------------ answers

    def _process_completions(self, now: int) -> None:
        with self._acc.lock:
            items = self._completions
            if not items:
                return
            self._completions = []
        finished: list[tuple[ProducerBatch, int, BaseException | None]] = []
        refresh = False
        for batches, call in items:
            self._requests_in_flight -= 1
            try:
                resp = call.result()
            except grpc.RpcError as rpc_exc:
                exc = translate_rpc_error(rpc_exc)
                refresh = refresh or needs_metadata_refresh(exc)
                for batch in batches:
                    self._on_batch_error(None, batch, exc, now, finished, dispatched=True)
                continue
            except Exception as other:  # e.g. grpc.FutureCancelledError at shutdown
                exc = errors.error_for(ErrorCode.NETWORK_EXCEPTION, f"Produce failed: {other!r}")
                for batch in batches:
                    self._on_batch_error(None, batch, exc, now, finished, dispatched=True)
                continue
            results = {(r.topic, r.partition): r for r in resp.results}
            for batch in batches:
                if batch.state == FINISHED:  # failed meanwhile (close)
                    continue
                seq = self._seq_of(batch)
                result = results.get((batch.topic, batch.partition))
                if result is None:
                    exc = errors.error_for(
                        ErrorCode.UNKNOWN_SERVER_ERROR,
                        f"Produce answer has no result for {batch.topic}-{batch.partition}",
                    )
                    self._on_batch_error(seq, batch, exc, now, finished, dispatched=True)
                    continue
                code = result.error.code
                if code == 0:
                    seq.on_success(batch)
                    finished.append((batch, result.base_offset, None))
                elif code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                    # Written before, at an offset the store no longer knows.
                    seq.on_success(batch)
                    finished.append((batch, -1, None))
                else:
                    exc = errors.error_for(code, result.error.message)
                    refresh = refresh or needs_metadata_refresh(exc)
                    self._on_batch_error(seq, batch, exc, now, finished, dispatched=True)
        if refresh:
            self._client.request_metadata_refresh()
        self._complete(finished)

    def _seq_of(self, batch: ProducerBatch) -> PartitionSequencer:
        return self._sequencers[(batch.topic, batch.partition)]

    def _on_batch_error(
        self,
        seq: PartitionSequencer | None,
        batch: ProducerBatch,
        exc: OncelogError,
        now: int,
        finished: list[tuple[ProducerBatch, int, BaseException | None]],
        *,
        dispatched: bool,
    ) -> None:
        if batch.state == FINISHED:  # failed meanwhile (fatal error, forced close)
            return
        if seq is None:
            seq = self._seq_of(batch)
        verdict = seq.on_error(batch, exc, now, dispatched=dispatched)
        if verdict is not None:
            log.debug("batch %r failed: %s", batch, verdict)
            finished.append((batch, -1, verdict))
        else:
            log.debug("batch %r will be retried after %s", batch, exc)

    def _complete(self, finished: list[tuple[ProducerBatch, int, BaseException | None]]) -> None:
        if not finished:
            return
        for batch, base_offset, error in finished:
            batch.finish(base_offset=base_offset, error=error)
        self._acc.completed([b for b, _, _ in finished])

    # ------------------------------------------------------------ failing

    def _expire(self, now: int) -> None:
        finished: list[tuple[ProducerBatch, int, BaseException | None]] = []
        expired = self._acc.expire(now)
        if expired:
            reason = ""
            if self._pid_last_error is not None:
                reason = (
                    f"; no producer id yet, last InitProducerId error: "
                    f"{type(self._pid_last_error).__name__}: {self._pid_last_error}"
                )
            for batch in expired:
                finished.append((batch, -1, errors.KafkaTimeoutError(
                    f"batch of {batch.record_count} records for {batch.topic}-"
                    f"{batch.partition} expired after delivery_timeout_ms before it could "
                    f"be sent{reason}"
                )))
        for key in list(self._active):
            for batch, exc in self._sequencers[key].expire(now):
                finished.append((batch, -1, exc))
        self._complete(finished)

    def _abort_all(self, exc: BaseException) -> None:
        """Fails every queued and unacknowledged batch (fatal error or close)."""
        finished: list[tuple[ProducerBatch, int, BaseException | None]] = [
            (batch, -1, exc) for batch in self._acc.drain_all()
        ]
        for key in list(self._active):
            for batch in self._sequencers[key].fail_all():
                finished.append((batch, -1, exc))
        self._active.clear()
        self._sequencers.clear()
        self._complete([f for f in finished if f[0].state != FINISHED])
