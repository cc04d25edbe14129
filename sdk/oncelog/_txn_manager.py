"""The transactional producer's transaction manager.

Its job is the transaction, as Kafka's TransactionManager's is: the
facade (`producer.Producer`) hands it every transactional call, and the
sender (`_sender.Sender`) asks it once per round what the transaction allows
and tells it when a record of the transaction failed.

It owns:

* the client-side state machine (`_transactions.TxnStateMachine`; every
  change under the accumulator's lock, which send() holds too);
* the coordinator calls, blocking on the user's thread with retries:
  InitProducerId, TxnOffsetCommit (to the group's coordinator, which adds
  the offsets' partition itself: no AddOffsetsToTxn), EndTxn (over one
  stream per coordinator), PrepareTransaction and CompleteTransaction
  (two-phase commit), and how their failures are sorted (fatal, retried,
  abortable). A transaction's partitions join it through its Produce
  requests (`add_partitions_to_txn`), so no AddPartitionsToTxn is sent;
* the producer id and epoch it hands to the sender after InitProducerId and
  EndTxn (the epoch bump of a transactional producer), waiting until the
  sender has taken them: the sender numbers every partition from 0 again;
* whether the open transaction reached the coordinator (`touched`: ending
  it then needs an EndTxn), and the prepared transaction it holds.

The producer's fatal error stays the sender's (every producer has one, not
only a transactional one); the manager reads it and sets it through the
sender. An idempotent producer without a transactional id has no manager:
its producer id and epoch bump are the sender's own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc

from oncelog._batching import RecordAccumulator
from oncelog._client import ClusterClient, error_from_proto
from oncelog._coordinators import (
    GROUP,
    TRANSACTION,
    CoordinatorLocator,
    call_coordinator,
)
from oncelog._request_streams import StreamCaller
from oncelog._sender import TXN_SENDING_STATES, with_authorization_advice
from oncelog._transactions import (
    Op,
    ProducerTxnState,
    TxnStateMachine,
    ends_producer,
    record_failure,
)
from oncelog.types import GroupMetadata, PreparedTxnState, TopicPartition
from oncelog.v1 import coordinator_pb2, errors_pb2, group_coordinator_pb2
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError

if TYPE_CHECKING:
    from oncelog._batching import ProducerBatch
    from oncelog._sender import Sender

# The producer's logger: the transaction's lines are the producer's.
log = logging.getLogger("oncelog.producer")

_T = TypeVar("_T")
_IN_TRANSACTION = ProducerTxnState.IN_TRANSACTION


class _Answer(Protocol):
    @property
    def error(self) -> errors_pb2.Error: ...


_AnswerT = TypeVar("_AnswerT", bound=_Answer)


def _answered(resp: _AnswerT) -> _AnswerT:
    """A reply whose request-level error, if any, is raised."""
    exc = error_from_proto(resp.error)
    if exc is not None:
        raise exc
    return resp


class TransactionManager:
    """The transaction of one transactional producer: its state, its
    coordinator calls, and the identity it hands to the sender.

    The transactional calls run on the user's thread (one at a time, as in
    Kafka); the sender thread calls `identity_applied`, `discard_error` and
    `on_record_failed`. Shared fields change under the accumulator's lock."""

    # The sender is made after the manager (it asks the manager once per
    # round), so it is attached before either runs (`attach`).
    _sender: Sender

    def __init__(
        self,
        *,
        client: ClusterClient,
        accumulator: RecordAccumulator,
        transactional_id: str,
        transaction_timeout_ms: int,
        two_phase_commit: bool,
        max_block_ms: int,
        flush: Callable[[float | None], None],
    ) -> None:
        self._client = client
        self._acc = accumulator
        self.transactional_id = transactional_id
        self.machine = TxnStateMachine(transactional_id)
        self._transaction_timeout_ms = transaction_timeout_ms
        self._two_phase_commit = two_phase_commit
        self._max_block_ms = max_block_ms
        # The producer's flush(): commit and prepare send every record first.
        self._flush = flush
        self._locator = locator = CoordinatorLocator(client, transactional_id, TRANSACTION)
        # Group id -> its coordinator's locator (send_offsets_to_transaction).
        self._group_locators: dict[str, CoordinatorLocator] = {}
        # EndTxn goes over one stream per coordinator (_request_streams.py).
        self._end_txns = StreamCaller(
            "EndTxnStream", client.coordinator,
            lambda exc, address: client.rpc_error(exc, address, service=locator.service),
            lambda address: client.silent(address, service=locator.service))
        # Two-phase commit: the prepared transaction this producer holds (after
        # prepare_transaction(), or kept by init_transactions), and the state
        # it was in when complete_transaction() started.
        self.prepared: PreparedTxnState | None = None
        self._completing_from = ProducerTxnState.READY
        # Some request of the open transaction reached (or may have reached)
        # the coordinator, directly or through a store adding a partition, so
        # ending it needs an EndTxn. Guarded by the lock.
        self.touched = False
        # A new producer id/epoch handed to the sender (after InitProducerId
        # or EndTxn); the sender applies it, clears this and counts it
        # applied. Guarded by the lock.
        self.identity_request: tuple[int, int] | None = None
        self._identities_requested = 0
        self._identities_applied = 0

    def attach(self, sender: Sender) -> None:
        """The sender this manager hands identities to and reads the
        producer's fatal error from; called once, before the sender starts."""
        self._sender = sender

    def close(self) -> None:
        self._end_txns.close()

    # ------------------------------------------------------------ the calls

    def init_transactions(self, timeout: float | None = None, *,
                          keep_prepared_txn: bool = False) -> None:
        """InitProducerId with retries (Producer.init_transactions)."""
        txn, locator = self.machine, self._locator
        if keep_prepared_txn and not self._two_phase_commit:
            raise ValueError(
                "init_transactions(keep_prepared_txn=True) needs a producer made with "
                "transaction_two_phase_commit_enable=True"
            )
        with self._acc.lock:
            txn.check(Op.INIT_TRANSACTIONS)
            txn.transition_to(ProducerTxnState.INITIALIZING)
        request = coordinator_pb2.InitProducerIdRequest(
            transactional_id=txn.transactional_id,
            transaction_timeout_ms=self._transaction_timeout_ms,
            producer_id=-1, producer_epoch=-1,
            enable_two_phase_commit=self._two_phase_commit,
            keep_prepared_txn=keep_prepared_txn,
        )

        def attempt(address: str, timeout_s: float) -> coordinator_pb2.InitProducerIdResponse:
            return _answered(
                self._client.coordinator(address).InitProducerId(request, timeout=timeout_s))

        resp = self._txn_call("InitProducerId", locator, attempt, timeout, fatal_on_error=True)
        self._set_identity(resp.producer_id, resp.producer_epoch)
        kept = resp.prepared_transaction if resp.HasField("prepared_transaction") else None
        if kept is not None:
            # Ending it needs EndTxn or CompleteTransaction, though this
            # instance sent nothing in it.
            self._mark_touched()
        with self._acc.lock:
            self.prepared = (None if kept is None
                             else PreparedTxnState(kept.producer_id, kept.producer_epoch))
            txn.transition_to(ProducerTxnState.READY if kept is None
                              else ProducerTxnState.PREPARED_TRANSACTION)
        log.debug("transactional id %r: producer id %d epoch %d%s", txn.transactional_id,
                  resp.producer_id, resp.producer_epoch,
                  "" if kept is None else f", keeps prepared transaction {self.prepared}")

    def begin_transaction(self) -> None:
        """Opens a transaction: local (Producer.begin_transaction)."""
        txn = self.machine
        with self._acc.lock:
            txn.check(Op.BEGIN_TRANSACTION)
            txn.transition_to(ProducerTxnState.IN_TRANSACTION)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                    group_metadata: GroupMetadata,
                                    timeout: float | None) -> None:
        """Checks the arguments, then TxnOffsetCommit
        (Producer.send_offsets_to_transaction)."""
        txn = self.machine
        if not isinstance(group_metadata, GroupMetadata):
            raise TypeError(
                f"group_metadata must be a GroupMetadata (consumer.group_metadata()), "
                f"got {group_metadata!r}"
            )
        if not group_metadata.group_id:
            raise ValueError("group_metadata.group_id must not be empty")
        for tp, offset in offsets.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"offsets must be keyed by TopicPartition, got {tp!r}")
            if type(offset) is not int or offset < 0:
                raise ValueError(f"offset for {tp} must be an int >= 0, got {offset!r}")
        with self._acc.lock:
            txn.check(Op.SEND_OFFSETS)
        if not offsets:
            return
        group_id = group_metadata.group_id
        md = self._client.metadata()
        if not md.group_coordinators:
            md = self._client.refresh_metadata(timeout_ms=self._client.request_timeout_ms)
        if not md.group_coordinators:
            # Checked before TxnOffsetCommit, so the transaction is untouched.
            raise errors.error_for(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"the cluster has no group coordinator, so the offsets of group {group_id!r} "
                "cannot join the transaction (send_offsets_to_transaction needs one)",
            )
        # The group coordinator's write may start the transaction at the
        # transaction coordinator: commit and abort must end it.
        self._mark_touched()
        self._txn_offset_commit(txn, offsets, group_metadata, timeout)

    def _txn_offset_commit(
        self,
        txn: TxnStateMachine,
        offsets: Mapping[TopicPartition, int],
        group_metadata: GroupMetadata,
        timeout: float | None,
    ) -> None:
        """TxnOffsetCommit to the group's coordinator, found with
        FindCoordinator(group_id, GROUP); its answers are sorted like every
        other transactional call's (fatal, retried, abortable)."""
        # One locator per group, kept: a read-process-write loop sends the
        # same group's offsets in every transaction.
        group_locator = self._group_locators.get(group_metadata.group_id)
        if group_locator is None:
            group_locator = CoordinatorLocator(self._client, group_metadata.group_id, GROUP)
            self._group_locators[group_metadata.group_id] = group_locator
        request = group_coordinator_pb2.TxnOffsetCommitRequest(
            transactional_id=txn.transactional_id,
            group_id=group_metadata.group_id,
            producer_id=self._sender.producer_id,
            producer_epoch=self._sender.producer_epoch,
            generation_id=group_metadata.generation_id,
            member_id=group_metadata.member_id,
            group_instance_id=group_metadata.group_instance_id or "",
            partitions=[
                group_coordinator_pb2.OffsetCommitPartition(
                    topic=tp.topic, partition=tp.partition, offset=offset,
                )
                for tp, offset in sorted(offsets.items())
            ],
        )

        def attempt(address: str, timeout_s: float) -> None:
            try:
                resp = self._client.group_coordinator(address).TxnOffsetCommit(
                    request, timeout=timeout_s
                )
            except grpc.RpcError as rpc_exc:
                if rpc_exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    raise errors.error_for(
                        ErrorCode.UNSUPPORTED_VERSION,
                        f"the group coordinator at {address} does not serve TxnOffsetCommit",
                    ) from None
                raise
            exc = error_from_proto(resp.error)
            if exc is None:
                for result in resp.results:
                    exc = error_from_proto(result.error)
                    if exc is not None:
                        exc = errors.error_for(
                            exc.code,
                            f"{result.topic}-{result.partition}: {exc.message}",
                        )
                        break
            if exc is not None:
                raise exc

        self._txn_call(
            f"TxnOffsetCommit of group {group_metadata.group_id!r}", group_locator, attempt,
            timeout,
        )

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flushes, then EndTxn(commit) (Producer.commit_transaction)."""
        txn, locator = self.machine, self._locator
        deadline_s = self._flush_transaction(txn, Op.COMMIT_TRANSACTION,
                                             ProducerTxnState.COMMITTING,
                                             timeout)
        self._end_txn(txn, locator, commit=True, deadline_s=deadline_s)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Flushes, then PrepareTransaction (Producer.prepare_transaction)."""
        txn, locator = self.machine, self._locator
        self._check_two_phase_commit("prepare_transaction")
        deadline_s = self._flush_transaction(txn, Op.PREPARE_TRANSACTION,
                                             ProducerTxnState.PREPARING,
                                             timeout)
        sender = self._sender
        request = coordinator_pb2.PrepareTransactionRequest(
            transactional_id=txn.transactional_id, producer_id=sender.producer_id,
            producer_epoch=sender.producer_epoch,
        )

        def attempt(address: str, timeout_s: float
                    ) -> coordinator_pb2.PrepareTransactionResponse:
            self._mark_touched()
            return _answered(self._client.coordinator(address).PrepareTransaction(
                request, timeout=timeout_s))

        resp = self._txn_call("PrepareTransaction", locator, attempt,
                              max(0.0, deadline_s - time.monotonic()))
        state = PreparedTxnState(resp.prepared_transaction.producer_id,
                                 resp.prepared_transaction.producer_epoch)
        with self._acc.lock:
            self.prepared = state
            txn.transition_to(ProducerTxnState.PREPARED_TRANSACTION)
        return state

    def complete_transaction(self, prepared_state: PreparedTxnState,
                             timeout: float | None = None) -> bool:
        """CompleteTransaction (Producer.complete_transaction)."""
        txn, locator = self.machine, self._locator
        if not isinstance(prepared_state, PreparedTxnState):
            raise TypeError(
                f"complete_transaction() takes a PreparedTxnState, got {prepared_state!r}"
            )
        self._check_two_phase_commit("complete_transaction")
        with self._acc.lock:
            txn.check(Op.COMPLETE_TRANSACTION)
            if txn.state is not ProducerTxnState.COMPLETING:
                self._completing_from = txn.state
                txn.transition_to(ProducerTxnState.COMPLETING)
        sender = self._sender
        request = coordinator_pb2.CompleteTransactionRequest(
            transactional_id=txn.transactional_id, producer_id=sender.producer_id,
            producer_epoch=sender.producer_epoch,
            prepared_transaction=coordinator_pb2.PreparedTxnState(
                producer_id=prepared_state.producer_id,
                producer_epoch=prepared_state.producer_epoch,
            ),
        )

        def attempt(address: str, timeout_s: float
                    ) -> coordinator_pb2.CompleteTransactionResponse:
            return _answered(self._client.coordinator(address).CompleteTransaction(
                request, timeout=timeout_s))

        try:
            resp = self._txn_call("CompleteTransaction", locator, attempt, timeout)
        except errors.KafkaTimeoutError:
            raise
        except OncelogError:
            with self._acc.lock:
                # The coordinator refused and changed nothing (fatal errors
                # have ended the producer already).
                if txn.state is ProducerTxnState.COMPLETING:
                    txn.transition_to(self._completing_from)
            raise
        self._set_identity(resp.producer_id, resp.producer_epoch)
        with self._acc.lock:
            self.prepared = None
            txn.transition_to(ProducerTxnState.READY)
        return bool(resp.committed)

    def _check_two_phase_commit(self, method: str) -> None:
        if not self._two_phase_commit:
            raise errors.error_for(
                ErrorCode.INVALID_TXN_STATE,
                f"{method}() needs a producer made with "
                "transaction_two_phase_commit_enable=True",
            )

    def _flush_transaction(self, txn: TxnStateMachine, op: Op, state: ProducerTxnState,
                           timeout: float | None) -> float:
        """commit_transaction and prepare_transaction: moves to `state` (no
        new records from here), sends every record of the transaction and
        waits for each, then checks that none failed. Returns the call's
        deadline (time.monotonic() seconds)."""
        deadline_s = time.monotonic() + self._budget_s(timeout)
        with self._acc.lock:
            txn.check(op)
            txn.transition_to(state)
        try:
            self._flush(max(0.0, deadline_s - time.monotonic()))
        except errors.KafkaTimeoutError as exc:
            raise errors.KafkaTimeoutError(
                f"{op.value}() timed out while records of the transaction were "
                f"still unacknowledged ({exc.message}); call {op.value}() again"
            ) from exc
        with self._acc.lock:
            # A record failed (abortable_error) or the producer was fenced.
            txn.check(op)
        return deadline_s

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Discards what is unsent, waits for what is in flight, then
        EndTxn(abort) (Producer.abort_transaction)."""
        txn, locator = self.machine, self._locator
        deadline_s = time.monotonic() + self._budget_s(timeout)
        acc = self._acc
        with acc.lock:
            txn.check(Op.ABORT_TRANSACTION)
            txn.transition_to(ProducerTxnState.ABORTING)
            acc.woken = True
            acc.wakeup.notify()
        self._wait_quiet(deadline_s)
        with acc.lock:
            txn.check(Op.ABORT_TRANSACTION)  # fenced meanwhile?
        self._end_txn(txn, locator, commit=False, deadline_s=deadline_s)

    def _end_txn(self, txn: TxnStateMachine, locator: CoordinatorLocator, *, commit: bool,
                 deadline_s: float) -> None:
        """EndTxn with retries (same producer id and epoch on every attempt, so
        the coordinator recognises a retry whose first answer was lost), then
        the next transaction's id and epoch, sequences from 0."""
        sender = self._sender
        if not self.touched:
            # Nothing reached the coordinator: there is nothing to end.
            self._set_identity(sender.producer_id, sender.producer_epoch)
        else:
            request = coordinator_pb2.EndTxnRequest(
                transactional_id=txn.transactional_id, producer_id=sender.producer_id,
                producer_epoch=sender.producer_epoch, commit=commit,
            )

            def attempt(address: str, timeout_s: float) -> coordinator_pb2.EndTxnResponse:
                stub = self._client.coordinator(address)
                return _answered(self._end_txns.call(
                    address, request, timeout_s,
                    unary=lambda: stub.EndTxn(request, timeout=timeout_s)))

            remaining_s = max(0.0, deadline_s - time.monotonic())
            what = "EndTxn(commit)" if commit else "EndTxn(abort)"
            resp = self._txn_call(what, locator, attempt, remaining_s, fatal_on_error=True)
            self._set_identity(resp.producer_id, resp.producer_epoch)
        with self._acc.lock:
            self.prepared = None
            txn.transition_to(ProducerTxnState.READY)

    def _txn_call(
        self,
        what: str,
        locator: CoordinatorLocator,
        attempt: Callable[[str, float], _T],
        timeout: float | None,
        *,
        fatal_on_error: bool = False,
    ) -> _T:
        """A transactional request with retries; sorts its failure: fatal codes
        (and, with fatal_on_error, every non-retriable error, as Kafka does for
        InitProducerId and EndTxn) make the producer fatal; other non-retriable
        errors break the transaction (abortable_error; raised as a
        TransactionAbortableError caused by the typed error); running out of
        time raises KafkaTimeoutError and leaves the state as it is."""
        txn = self.machine
        try:
            return call_coordinator(
                self._client, locator, what, attempt,
                budget_ms=int(self._budget_s(timeout) * 1000),
            )
        except errors.KafkaTimeoutError:
            raise
        except OncelogError as exc:
            detailed = errors.error_for(
                exc.code, f"{what} for transactional id {txn.transactional_id!r}: "
                f"{exc.message or exc.code.name}",
            )
            if ends_producer(exc) or fatal_on_error:
                detailed = with_authorization_advice(detailed)
                self._sender.fail_fatal(detailed)
                raise detailed from exc
            with self._acc.lock:
                if txn.state in (ProducerTxnState.IN_TRANSACTION, ProducerTxnState.PREPARING):
                    txn.transition_to(ProducerTxnState.ABORTABLE_ERROR, detailed)
            if isinstance(detailed, errors.TransactionAbortableError):
                raise detailed from exc
            # The code's own class (StaleMemberEpochError, say) does not say
            # "abort": a failure that breaks the transaction is raised as a
            # TransactionAbortableError, caused by the typed error, so one
            # except clause catches every transaction that must be aborted.
            raise errors.error_for(
                ErrorCode.TRANSACTION_ABORTABLE,
                f"{type(detailed).__name__}: {detailed.message}; the transaction must be "
                "aborted with abort_transaction()",
            ) from detailed

    def _budget_s(self, timeout: float | None) -> float:
        return self._max_block_ms / 1000 if timeout is None else max(0.0, timeout)


    # ------------------------------------------------------------ send()'s share

    def check(self, op: Op) -> None:
        """Raises unless `op` is allowed in the current state."""
        with self._acc.lock:
            self.machine.check(op)

    def break_transaction(self, topic: str, partition: int, exc: BaseException) -> None:
        with self._acc.lock:
            self.break_transaction_locked(topic, partition, exc)

    def break_transaction_locked(self, topic: str, partition: int, exc: BaseException) -> None:
        """A record of the open transaction failed before it reached the
        accumulator: the transaction cannot commit (abortable_error). Caller
        holds the accumulator lock."""
        txn = self.machine
        if txn.state is not _IN_TRANSACTION or self._sender.fatal_error is not None:
            # No open transaction (the record was refused for that), one that
            # already failed (the first failure is the one reported), or a
            # producer the sender has already ended.
            return
        described = record_failure(topic, partition, exc)
        log.info("transaction of %r is now abortable: %s", txn.transactional_id, described)
        txn.transition_to(ProducerTxnState.ABORTABLE_ERROR, described)

    # ------------------------------------------------------------ the sender's share

    def _mark_touched(self) -> None:
        """A request of the open transaction is about to reach the coordinator."""
        with self._acc.lock:
            self.touched = True

    def _set_identity(self, producer_id: int, producer_epoch: int) -> None:
        """Hands a new producer id and epoch to the sender (user's thread, after
        InitProducerId or EndTxn) and waits until it has taken them: every
        partition then starts again at sequence 0. Only called when nothing is
        queued or in flight."""
        acc = self._acc
        sender = self._sender
        with acc.lock:
            self.identity_request = (producer_id, producer_epoch)
            self._identities_requested += 1
            wanted = self._identities_requested
            acc.woken = True
            acc.wakeup.notify()
            # Counted, not `while self.identity_request is not None`: the
            # assignment above narrows that field's type, and a compiled
            # module (mypyc) enforces the narrowed type when the sender
            # thread has reset it.
            while self._identities_applied < wanted:
                if sender.fatal_error is not None:
                    raise sender.fatal_copy()
                if not sender.thread.is_alive():
                    raise errors.IllegalStateError("the producer's sender thread has stopped")
                acc.changed.wait(0.1)

    def identity_applied(self) -> None:
        """The sender took the identity handed over (sender thread): the next
        transaction starts untouched. Caller holds the accumulator lock."""
        self.touched = False
        self.identity_request = None
        self._identities_applied += 1
        self._acc.changed.notify_all()

    def _wait_quiet(self, deadline_s: float) -> None:
        """Waits (user's thread, in aborting) until no batch of the transaction
        is queued or in flight."""
        acc = self._acc
        sender = self._sender
        with acc.lock:
            while acc.incomplete:
                if sender.fatal_error is not None:
                    raise sender.fatal_copy()
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    raise errors.KafkaTimeoutError(
                        f"abort_transaction() timed out waiting for {len(acc.incomplete)} "
                        f"batches in flight; call abort_transaction() again"
                    )
                acc.changed.wait(min(remaining_s, 0.1))

    def discard_error(self, state: ProducerTxnState) -> errors.TransactionAbortedError:
        """The error of a batch the sender discards in abortable_error or
        aborting (sender thread)."""
        cause = self.machine.error
        # A batch waiting for a retry may have been written already (its
        # answer was lost): "acknowledged", not "sent". Either way the abort's
        # marker keeps it from every read_committed reader.
        if state is ProducerTxnState.ABORTING or cause is None:
            reason = "the transaction was aborted before this record was acknowledged"
        else:
            detail = (f"{type(cause).__name__}: {cause.message}"
                      if isinstance(cause, OncelogError) else repr(cause))
            reason = (f"the transaction failed ({detail}) before this record was "
                      "acknowledged; it must be aborted")
        error = errors.TransactionAbortedError(
            f"transactional id {self.transactional_id!r}: {reason}"
        )
        error.__cause__ = cause
        return error

    def on_record_failed(self, batch: ProducerBatch, error: BaseException) -> None:
        """A record of the transaction failed for good (sender thread): the end
        of the producer (fenced, data lost) or of the transaction (everything
        else, a record that ran out of delivery_timeout_ms included)."""
        sender = self._sender
        if sender.fatal_error is not None:
            return
        if ends_producer(error):
            assert isinstance(error, OncelogError)
            sender.fail_fatal(error)
            return
        with self._acc.lock:
            if self.machine.state in TXN_SENDING_STATES:
                described = record_failure(batch.topic, batch.partition, error)
                log.info("transaction of %r is now abortable: %s", self.transactional_id,
                         described)
                self.machine.transition_to(ProducerTxnState.ABORTABLE_ERROR, described)
