"""The producer's sender: the background thread that delivers batches.

Its job is everything between the accumulator and the stores: it takes the
batches that are ready (`_batching.RecordAccumulator`), gives each its
sequence number (`_sequencing.PartitionSequencer`, one per partition),
groups them by store into one Produce request per store (over
`_request_streams.RequestStreams`), honours the stores' throttle times, and
resolves each batch's futures when its answer comes, retrying what may be
retried with the identical bytes.

It owns the per-partition sequencers, the requests in flight and their
answers, the producer id and epoch an idempotent producer got for itself
(InitProducerId with no transactional id, and the local epoch bump after a
broken sequence), and the producer's fatal error. A transactional producer's
transaction (its state, the identity handed over after InitProducerId and
EndTxn, the coordinator calls) belongs to its transaction manager
(`_txn_manager.py`), which the sender asks once per round and tells when a
record of the transaction failed.

Per batch, not per record, but on the producer's hot path all the same: it
is compiled with the producer (build_support/oncelog_build.py).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from oncelog._batching import FINISHED, ProducerBatch, RecordAccumulator
from oncelog._client import (
    ClusterClient,
    ClusterMetadata,
    backoff_ms,
    error_from_proto,
    needs_metadata_refresh,
)
from oncelog._config import DEFAULT_CLIENT_ID
from oncelog._request_streams import Outcome, RequestStreams
from oncelog._sequencing import PartitionMode, PartitionSequencer
from oncelog._throttle import Throttles
from oncelog._transactions import ProducerTxnState
from oncelog.v1 import coordinator_pb2, partition_store_pb2
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.limits import MAX_GRPC_MESSAGE_BYTES
from oncelog.wire.records import MAX_PRODUCER_EPOCH

if TYPE_CHECKING:
    from oncelog._txn_manager import TransactionManager

# The producer's logger: the sender's lines are the producer's.
log = logging.getLogger("oncelog.producer")

# One Produce request carries at most this many bytes of batches (headroom
# under the gRPC message limit for the request's own fields).
MAX_REQUEST_BYTES = MAX_GRPC_MESSAGE_BYTES // 2
# How often the sender looks for batches past their delivery deadline.
EXPIRY_CHECK_INTERVAL_MS = 50
# The longest the sender sleeps while anything is incomplete (housekeeping).
MAX_SENDER_SLEEP_MS = 100
# States in which the sender sends a transaction's batches.
TXN_SENDING_STATES = frozenset({
    ProducerTxnState.IN_TRANSACTION, ProducerTxnState.COMMITTING, ProducerTxnState.PREPARING,
})
# States in which the sender discards a transaction's unsent batches.
_TXN_DISCARDING = frozenset({ProducerTxnState.ABORTABLE_ERROR, ProducerTxnState.ABORTING})


# The refusals of a producer id that end a producer (Kafka's
# ClusterAuthorizationException and TransactionalIdAuthorizationException are
# fatal too): its message says what to do, since the usual cause is a
# producer made a moment before its ACL was created.
_AUTHORIZATION_ENDS_PRODUCER = frozenset({ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                          ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})


def with_authorization_advice(exc: OncelogError) -> OncelogError:
    """`exc`, with what to do added when it is a refusal for authorization
    that ends the producer."""
    if exc.code not in _AUTHORIZATION_ENDS_PRODUCER:
        return exc
    advised = errors.error_for(
        exc.code,
        f"{exc.message or exc.code.name}. This producer cannot go on (the refusal of its "
        "producer id is fatal, as in Kafka): once the principal has the ACL it needs "
        "(new ACLs apply on every service within about a second of being created; "
        "docs/security.md, \"A producer made before its ACL\"), close this "
        "producer and create a new one",
    )
    advised.__cause__ = exc
    return advised


class Sender:
    """The producer's background thread: drains, numbers, sends, completes.

    Everything here except the completion queue and `fatal_error` is owned
    by the sender thread; gRPC callbacks only append to the completion queue
    (under the accumulator's lock) and wake the thread. A transactional
    producer's transaction is its `TransactionManager`'s: the sender asks it
    once per round for a new identity and the state, and tells it of every
    record of the transaction that failed.

    A transactional producer's Produce requests ask the store to add each
    partition to the transaction before its first batch there
    (`add_partitions_to_txn`, Kafka's transaction version 2): the sender sends
    no AddPartitionsToTxn, so a transaction's first batches leave as soon as
    they are ready instead of one coordinator round trip later. In
    abortable_error and aborting it sends nothing new and fails every batch
    that is not in flight.
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
        clock_ms: Callable[[], int],
        txn: TransactionManager | None = None,
        client_id: str = DEFAULT_CLIENT_ID,
    ) -> None:
        self._client = client
        # The producer's monotonic clock (milliseconds), the accumulator's too.
        self._clock_ms = clock_ms
        self._client_id = client_id
        # When each store asked to be sent nothing before (throttle times).
        self.throttles = Throttles("produce")
        self._acc = accumulator
        self._idempotent = idempotent
        self._max_in_flight = max_in_flight
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_backoff_max_ms = retry_backoff_max_ms
        self._transaction_timeout_ms = transaction_timeout_ms
        self._sequencers: dict[tuple[str, int], PartitionSequencer] = {}
        # Where each partition's last attempt went: (store address, leader
        # epoch) by the metadata of the time.
        self._sent_to: dict[tuple[str, int], tuple[str, int | None]] = {}
        # Partitions with unacknowledged batches or a pending retry/reset.
        self._active: set[tuple[str, int]] = set()
        # (store address, batches, answer) of each request answered.
        self._completions: list[tuple[str, list[ProducerBatch], grpc.Future | Outcome]] = []
        self.producer_id = -1
        self.producer_epoch = -1
        self.fatal_error: OncelogError | None = None
        self._pid_attempts = 0
        self._pid_retry_at_ms = 0
        self._pid_last_error: OncelogError | None = None
        self._coordinator_index = random.randrange(1 << 16)
        self._next_expiry_check_ms = 0
        self._force_close = False
        # Transactions (None / unused for other producers).
        self._txn = txn
        self._transactional_id = "" if txn is None else txn.transactional_id
        # Produce requests go over one stream per store (_request_streams.py);
        # their outcomes arrive like a unary call's.
        self._streams = RequestStreams("ProduceStream", client.store,
                                       lambda exc, _address: client.translate(exc),
                                       self._on_rpc_done)
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
            crashed = errors.error_for(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"producer sender thread crashed: {exc!r}"
            )
            self._abort_all(crashed)
            self.fail_fatal(crashed)
        finally:
            # Nothing is waiting for an answer any more (or a forced close
            # gave up on it): end the streams.
            self._streams.close(errors.error_for(ErrorCode.NETWORK_EXCEPTION,
                                                 "the producer is closed"))

    def _loop_once(self) -> bool:
        """One round; False when the sender is done."""
        now = self._clock_ms()
        self._process_completions(now)
        if self._force_close:
            self._abort_all(errors.KafkaTimeoutError(
                "the producer was closed before the record was acknowledged"
            ))
            return False
        if self.fatal_error is not None:
            self._abort_all(self.fatal_error)
        elif self._txn is not None:
            self._txn_step(now)
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
        next_deadline_s = self._streams.expire()
        if next_deadline_s is not None:
            deadline_ms = now + int(next_deadline_s * 1000) + 1
            wake_at_ms = deadline_ms if wake_at_ms is None else min(wake_at_ms, deadline_ms)
        acc = self._acc
        with acc.lock:
            acc.sender_pass_done()
            if (
                acc.closing and not acc.incomplete and not acc.requests_unanswered
                and (self._txn is None or self._txn.identity_request is None)
            ):
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

    # ------------------------------------------------------------ transactions

    def _txn_step(self, now: int) -> None:
        """The sender's share of a transaction, once per round: apply a new
        identity, discard what an aborted transaction will not send."""
        txn = self._txn
        assert txn is not None
        acc = self._acc
        with acc.lock:
            identity = txn.identity_request
            state = txn.machine.state
        if identity is not None:
            self._apply_identity(identity)
            return
        if state in _TXN_DISCARDING:
            self._discard_unsent(state)

    def _apply_identity(self, identity: tuple[int, int]) -> None:
        if any(seq.window for seq in self._sequencers.values()):
            # A bug: a transaction only ends once none of its batches is pending.
            raise RuntimeError("a new producer epoch while batches are unacknowledged")
        self.producer_id, self.producer_epoch = identity
        self._sequencers.clear()
        self._active.clear()
        txn = self._txn
        assert txn is not None
        with self._acc.lock:
            txn.identity_applied()
        log.debug("transactional producer %r now producer id %d epoch %d",
                  self._transactional_id, self.producer_id, self.producer_epoch)

    def _discard_unsent(self, state: ProducerTxnState) -> None:
        """Fails every batch of the transaction that is not in flight: queued
        ones and those waiting for a retry. In-flight ones finish normally."""
        txn = self._txn
        assert txn is not None
        drained = self._acc.drain_all()
        unsent: list[ProducerBatch] = list(drained)
        for key in list(self._active):
            unsent.extend(self._sequencers[key].discard_unsent())
        if not unsent:
            return
        error = txn.discard_error(state)
        self._complete([(batch, -1, error) for batch in unsent if batch.state != FINISHED])

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
                raise self._client.translate(rpc_exc) from None
            exc = error_from_proto(resp.error)
            if exc is not None:
                raise exc
        except OncelogError as exc:
            self._pid_last_error = exc
            if not exc.retriable:
                self._set_fatal(with_authorization_advice(exc))
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
        self.fail_fatal(exc)
        self._abort_all(exc)

    def fail_fatal(self, exc: OncelogError) -> None:
        """The producer can never go on (any thread). The sender fails every
        record at its next round."""
        acc = self._acc
        with acc.lock:
            if self.fatal_error is None:
                self.fatal_error = exc
            if self._txn is not None:
                self._txn.machine.transition_to(ProducerTxnState.FATAL_ERROR, self.fatal_error)
            acc.woken = True
            acc.wakeup.notify()
            acc.changed.notify_all()

    def fatal_copy(self) -> OncelogError:
        """The fatal error, a fresh instance to raise (tracebacks grow)."""
        fatal = self.fatal_error
        assert fatal is not None
        dup = type(fatal)(fatal.message)
        dup.__cause__ = fatal
        return dup

    def _reset_sequences_if_needed(self, now: int) -> None:
        """Partitions whose sequence broke need the producer on a newer epoch
        than the one they used; bump it (locally, as Kafka's idempotent producer
        does: the store accepts a higher epoch starting at sequence 0) or, when
        the epoch is exhausted, get a new producer id, then renumber."""
        if self._txn is not None:
            return  # a transaction gets its new epoch from EndTxn instead
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
                transactional=self._txn is not None,
            )
        return seq

    def _send_ready(self, now: int) -> int | None:
        """Takes sendable batches from the accumulator, sends what the
        partitions allow; returns when something next becomes due."""
        ready, wake_at = self._acc.ready_partitions(now)
        can_assign = self.fatal_error is None and (
            not self._idempotent or self.producer_id >= 0
        )
        txn = self._txn
        if txn is not None and txn.machine.state not in TXN_SENDING_STATES:
            can_assign = False
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
        watch_leaders = False
        for key in list(self._active):
            seq = self._sequencers[key]
            held_until_ms = self._held_until_ms(key, now)
            if held_until_ms is not None:
                # Its store throttles this producer: nothing goes there yet.
                wake_at = held_until_ms if wake_at is None else min(wake_at, held_until_ms)
                continue

            if seq.waits_for_a_leader(now):
                # Its backoff was for the leader its last attempt went to.
                # Metadata is asked again while it waits (not only once
                # after the failure, which may be a whole backoff before
                # the election), and once it shows another leader the
                # partition is retried there at once: a failover costs the
                # election plus a metadata round, not one or two backoffs
                # grown to their cap.
                watch_leaders = True
                if md is not None and self._leader_moved(key, md):
                    seq.retry_now()
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
            self._sent_to[key] = (address, md.leader_epoch(*key) if md is not None else None)
            slots = by_address.setdefault(address, [])
            for i, batch in enumerate(batches):
                if len(slots) <= i:
                    slots.append([])
                slots[i].append(batch)
        self._complete(finished)
        for address, slots in by_address.items():
            for batches in slots:
                self._dispatch(address, batches, now)
        if watch_leaders:
            # At most one a retry_backoff_ms (the client's limit); the
            # sender looks again within MAX_SENDER_SLEEP_MS.
            self._client.request_metadata_refresh()
        return wake_at

    def _held_until_ms(self, key: tuple[str, int], now: int) -> int | None:
        md = self._client.cached_metadata
        address = md.leader_address(*key) if md is not None else None
        return None if address is None else self.throttles.held_until_ms(address, now)

    def _leader_moved(self, key: tuple[str, int], md: ClusterMetadata) -> bool:
        """Whether the metadata names another leader (store or leader
        epoch) for the partition than the one its last attempt went to."""
        address = md.leader_address(*key)
        return address is not None and (address, md.leader_epoch(*key)) != self._sent_to.get(key)

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
        md = self._client.cached_metadata
        request = partition_store_pb2.ProduceRequest(
            batches=[
                partition_store_pb2.PartitionBatch(
                    topic=b.topic, partition=b.partition, batch=b.data or b"",
                    leader_epoch=md.leader_epoch(b.topic, b.partition) if md else None,
                )
                for b in batches
            ],
            timeout_ms=self._request_timeout_ms,
            transactional_id=self._transactional_id,
            add_partitions_to_txn=self._txn is not None,
            client_id=self._client_id,
        )
        # The attempt may not outlive the latest delivery deadline among its
        # batches (a cut-short attempt counts as "outcome unknown").
        latest_deadline = max(b.deadline_ms for b in batches)
        timeout_ms = min(self._request_timeout_ms + 1000, max(latest_deadline - now, 50))
        txn = self._txn
        with self._acc.lock:
            if txn is not None:
                # The store may add partitions to the transaction for this request.
                txn.touched = True
            self._acc.requests_unanswered += 1
        try:
            if self._streams.serves(address):
                self._streams.send(address, request, (address, batches), timeout_ms / 1000)
                return
            call = self._client.store(address).Produce.future(request, timeout=timeout_ms / 1000)
        except (OncelogError, ValueError, RuntimeError) as exc:
            with self._acc.lock:
                self._acc.requests_unanswered -= 1
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
        call.add_done_callback(functools.partial(self._on_rpc_done, (address, batches)))

    def _on_rpc_done(self, sent: tuple[str, list[ProducerBatch]],
                     call: grpc.Future | Outcome) -> None:
        # A gRPC (or stream reader) thread: only hand the answer over to the
        # sender thread.
        acc = self._acc
        with acc.lock:
            acc.requests_unanswered -= 1
            self._completions.append((sent[0], sent[1], call))
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
        for address, batches, call in items:
            try:
                resp = call.result()
            except grpc.RpcError as rpc_exc:
                exc = self._client.translate(rpc_exc)
                refresh = refresh or needs_metadata_refresh(exc)
                for batch in batches:
                    self._on_batch_error(None, batch, exc, now, finished, dispatched=True)
                continue
            except OncelogError as unanswered:  # a stream's request that got no answer
                refresh = refresh or needs_metadata_refresh(unanswered)
                for batch in batches:
                    self._on_batch_error(None, batch, unanswered, now, finished, dispatched=True)
                continue
            except Exception as other:  # e.g. grpc.FutureCancelledError at shutdown
                exc = errors.error_for(ErrorCode.NETWORK_EXCEPTION, f"Produce failed: {other!r}")
                for batch in batches:
                    self._on_batch_error(None, batch, exc, now, finished, dispatched=True)
                continue
            if resp.error.code:  # a stream's request that failed as a whole
                failed = errors.error_for(resp.error.code, resp.error.message)
                refresh = refresh or needs_metadata_refresh(failed)
                for batch in batches:
                    self._on_batch_error(None, batch, failed, now, finished, dispatched=True)
                continue
            self.throttles.answered(address, resp.throttle_time_ms, now)
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
        txn = self._txn
        if txn is not None:
            # Before the futures complete: commit_transaction() must find the
            # transaction broken once it sees a record failed.
            for batch, _offset, error in finished:
                if error is not None:
                    txn.on_record_failed(batch, error)
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
