"""The transactional producer's client-side state machine, as one table.

Pure logic (no gRPC, no threads, no clock): the producer asks `check(op)`
before every transactional call and `transition_to(state)` after every
outcome; the table below decides. The same table answers both questions, so
what a method may do and where the producer may go are written down once.

How errors are sorted: by `oncelog.errors.PRODUCER_ERROR_CLASSES`, the one
table of KIP-1050's classes (retriable, abortable, application-recoverable,
fatal; docs/sdk.md prints it). Retriable errors are retried by whoever met
them (the sender, `call_coordinator`); once a record or a transactional
request fails for good, `ends_producer` says whether the producer is done
(fatal_error) or only the transaction (abortable_error). Any record of a
transaction that fails, at any stage — refused in send(), refused by the
store, expired — breaks the transaction (`record_failure` names it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError, ProducerErrorClass


def ends_producer(exc: BaseException) -> bool:
    """True when `exc`, met by a transactional call or a record of a
    transaction, ends the producer (application-recoverable or fatal); False
    when it breaks only the transaction (or, if retriable, was retried and
    ran out of time: then too only the transaction breaks)."""
    return errors.producer_error_class(exc) in _ENDS_PRODUCER


_ENDS_PRODUCER = frozenset({ProducerErrorClass.APPLICATION_RECOVERABLE,
                            ProducerErrorClass.FATAL})


def record_failure(topic: str, partition: int, exc: BaseException) -> BaseException:
    """The error that breaks a transaction when one of its records failed: of
    the same class as `exc` (so it is sorted the same), its message naming the
    record's topic and partition, caused by `exc`. `partition` -1: not chosen
    yet."""
    where = topic if partition < 0 else f"{topic}-{partition}"
    if isinstance(exc, OncelogError):
        described: BaseException = type(exc)(f"record for {where}: {exc.message or exc.code.name}")
    else:
        described = errors.error_for(
            ErrorCode.TRANSACTION_ABORTABLE,
            f"record for {where}: {type(exc).__name__}: {exc}",
        )
    described.__cause__ = exc
    return described


class Op(enum.Enum):
    """The calls of a transactional producer that depend on its state."""

    INIT_TRANSACTIONS = "init_transactions"
    BEGIN_TRANSACTION = "begin_transaction"
    SEND = "send"
    SEND_OFFSETS = "send_offsets_to_transaction"
    COMMIT_TRANSACTION = "commit_transaction"
    ABORT_TRANSACTION = "abort_transaction"
    PREPARE_TRANSACTION = "prepare_transaction"
    COMPLETE_TRANSACTION = "complete_transaction"


class ProducerTxnState(enum.StrEnum):
    """The transactional producer's state. Each state's doc says how it answers
    the calls (action) and where it can go (transition); `TABLE` holds the same
    as data."""

    UNINITIALIZED = "uninitialized"
    """No producer id yet.
    action: init_transactions starts; anything else is IllegalStateError.
    transition: initializing."""

    INITIALIZING = "initializing"
    """InitProducerId is running (or timed out: calling init_transactions
    again resumes it).
    action: init_transactions; anything else is IllegalStateError.
    transition: ready on the producer id; prepared_transaction when
    keep_prepared_txn kept an earlier instance's prepared transaction;
    fatal_error."""

    READY = "ready"
    """A producer id and epoch, no open transaction.
    action: begin_transaction; complete_transaction (two-phase commit: asks
    how a prepared transaction ended, e.g. a repeated completion); anything
    else is IllegalStateError.
    transition: in_transaction, completing."""

    IN_TRANSACTION = "in_transaction"
    """A transaction is open: records and offsets join it.
    action: send, send_offsets_to_transaction, commit_transaction,
    abort_transaction, prepare_transaction (two-phase commit).
    transition: committing, aborting, preparing; abortable_error when a
    record or a request of the transaction fails; fatal_error."""

    PREPARING = "preparing"
    """prepare_transaction is flushing or waiting for PrepareTransaction. If
    it timed out, call it again (it resumes) or abort_transaction.
    action: prepare_transaction (resumes), abort_transaction.
    transition: prepared_transaction; aborting; abortable_error when a record
    of the transaction failed; fatal_error."""

    PREPARED_TRANSACTION = "prepared_transaction"
    """Two-phase commit: the transaction is prepared (every record written)
    and waits for its outcome; nothing more may be sent in it.
    action: complete_transaction, commit_transaction, abort_transaction.
    transition: completing, committing, aborting; fatal_error."""

    COMPLETING = "completing"
    """complete_transaction is waiting for CompleteTransaction. If it timed
    out, the outcome is unknown: call complete_transaction again with the
    same prepared state (the coordinator answers a retry as the first try).
    action: complete_transaction (resumes).
    transition: ready; back where it came from (ready,
    prepared_transaction) when the coordinator refused; fatal_error."""

    COMMITTING = "committing"
    """commit_transaction is flushing or waiting for EndTxn(commit). If it
    timed out, the outcome is unknown: only commit_transaction may be called
    again, and it retries with the same producer id and epoch (a commit is
    never turned into an abort).
    action: commit_transaction (resumes); anything else is IllegalStateError.
    transition: ready after EndTxn; abortable_error when a record of the
    transaction failed; fatal_error."""

    ABORTING = "aborting"
    """abort_transaction is discarding unsent records, waiting for in-flight
    ones, and EndTxn(abort).
    action: abort_transaction (resumes); anything else is IllegalStateError.
    transition: ready after EndTxn; fatal_error."""

    ABORTABLE_ERROR = "abortable_error"
    """A record or request of the transaction failed; it cannot commit.
    action: abort_transaction; send, send_offsets_to_transaction and
    commit_transaction raise the error that broke the transaction; the rest
    is IllegalStateError.
    transition: aborting; fatal_error."""

    FATAL_ERROR = "fatal_error"
    """Fenced by a newer instance, or the log lost data: the producer is done.
    action: every call raises the fatal error (close() still closes).
    transition: none."""


_ALL_OPS = frozenset(Op)


@dataclass(frozen=True, slots=True)
class Row:
    """One state's row: the calls it accepts, the calls that raise the
    state's error instead of IllegalStateError, and the states it may go to."""

    accepts: frozenset[Op]
    raises_error: frozenset[Op]
    leads_to: frozenset[ProducerTxnState]


def _row(accepts: set[Op], leads_to: set[ProducerTxnState],
         raises_error: frozenset[Op] | set[Op] = frozenset()) -> Row:
    return Row(frozenset(accepts), frozenset(raises_error), frozenset(leads_to))


S = ProducerTxnState
# The one table: every call and every transition of the transactional producer.
TABLE: dict[ProducerTxnState, Row] = {
    S.UNINITIALIZED: _row({Op.INIT_TRANSACTIONS}, {S.INITIALIZING, S.FATAL_ERROR}),
    S.INITIALIZING: _row({Op.INIT_TRANSACTIONS},
                         {S.READY, S.PREPARED_TRANSACTION, S.FATAL_ERROR}),
    S.READY: _row({Op.BEGIN_TRANSACTION, Op.COMPLETE_TRANSACTION},
                  {S.IN_TRANSACTION, S.COMPLETING, S.FATAL_ERROR}),
    S.IN_TRANSACTION: _row(
        {Op.SEND, Op.SEND_OFFSETS, Op.COMMIT_TRANSACTION, Op.ABORT_TRANSACTION,
         Op.PREPARE_TRANSACTION},
        {S.COMMITTING, S.ABORTING, S.PREPARING, S.ABORTABLE_ERROR, S.FATAL_ERROR},
    ),
    S.PREPARING: _row(
        {Op.PREPARE_TRANSACTION, Op.ABORT_TRANSACTION},
        {S.PREPARED_TRANSACTION, S.ABORTING, S.ABORTABLE_ERROR, S.FATAL_ERROR},
    ),
    S.PREPARED_TRANSACTION: _row(
        {Op.COMPLETE_TRANSACTION, Op.COMMIT_TRANSACTION, Op.ABORT_TRANSACTION},
        {S.COMPLETING, S.COMMITTING, S.ABORTING, S.FATAL_ERROR},
    ),
    S.COMPLETING: _row(
        {Op.COMPLETE_TRANSACTION}, {S.READY, S.PREPARED_TRANSACTION, S.FATAL_ERROR},
    ),
    S.COMMITTING: _row(
        {Op.COMMIT_TRANSACTION}, {S.READY, S.ABORTABLE_ERROR, S.FATAL_ERROR},
    ),
    S.ABORTING: _row({Op.ABORT_TRANSACTION}, {S.READY, S.FATAL_ERROR}),
    S.ABORTABLE_ERROR: _row(
        {Op.ABORT_TRANSACTION}, {S.ABORTING, S.FATAL_ERROR},
        raises_error={Op.SEND, Op.SEND_OFFSETS, Op.COMMIT_TRANSACTION,
                      Op.PREPARE_TRANSACTION},
    ),
    S.FATAL_ERROR: _row(set(), set(), raises_error=_ALL_OPS),
}
del S


class TxnStateMachine:
    """The state, and the error that put the producer into abortable_error or
    fatal_error. Not thread-safe: the producer calls it under its lock."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.state = ProducerTxnState.UNINITIALIZED
        # The error that broke the transaction (abortable_error) or the
        # producer (fatal_error); None otherwise.
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        return f"TxnStateMachine({self.transactional_id!r}, {self.state.value})"

    def refusal(self, op: Op) -> BaseException | None:
        """None when `op` is allowed now, else the exception to raise."""
        row = TABLE[self.state]
        if op in row.accepts:
            return None
        if op in row.raises_error and self.error is not None:
            return self._state_error(op)
        return errors.IllegalStateError(
            f"{op.value}() is not allowed while transactional producer "
            f"{self.transactional_id!r} is in state {self.state.value}{self._hint(op)}"
        )

    def check(self, op: Op) -> None:
        """Raises unless `op` is allowed in the current state."""
        refusal = self.refusal(op)
        if refusal is not None:
            raise refusal

    def transition_to(self, target: ProducerTxnState, error: BaseException | None = None) -> None:
        """Moves to `target` if the table allows it; crashes loudly otherwise
        (the producer only asks for allowed moves, so a refusal is a bug).
        `error` is kept for abortable_error and fatal_error."""
        if target is self.state:
            return
        if target not in TABLE[self.state].leads_to:
            raise RuntimeError(
                f"transactional producer {self.transactional_id!r}: illegal transition "
                f"{self.state.value} -> {target.value}"
            )
        self.state = target
        if target in (ProducerTxnState.ABORTABLE_ERROR, ProducerTxnState.FATAL_ERROR):
            self.error = error
        elif target is not ProducerTxnState.ABORTING:
            self.error = None

    # ------------------------------------------------------------- helpers

    def _state_error(self, op: Op) -> BaseException:
        err = self.error
        if self.state is ProducerTxnState.FATAL_ERROR:
            if isinstance(err, OncelogError):
                # The same error, a fresh instance per raise (tracebacks grow).
                dup = type(err)(err.message)
                dup.__cause__ = err
                return dup
            return errors.error_for(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"the producer failed: {err!r}"
            )
        cause = (f"{type(err).__name__}: {err.message}" if isinstance(err, OncelogError)
                 else repr(err))
        exc = errors.error_for(
            ErrorCode.TRANSACTION_ABORTABLE,
            f"{op.value}() refused: the transaction of {self.transactional_id!r} failed "
            f"({cause}) and must be aborted with abort_transaction()",
        )
        exc.__cause__ = err
        return exc

    def _hint(self, op: Op) -> str:
        state = self.state
        if state is ProducerTxnState.UNINITIALIZED:
            return "; call init_transactions() first"
        if state is ProducerTxnState.READY and op in (Op.SEND, Op.SEND_OFFSETS,
                                              Op.COMMIT_TRANSACTION, Op.ABORT_TRANSACTION):
            return "; call begin_transaction() first"
        if state is ProducerTxnState.IN_TRANSACTION and op is Op.BEGIN_TRANSACTION:
            return "; a transaction is already open"
        if state is ProducerTxnState.COMMITTING:
            return "; the commit's outcome is not known yet: call commit_transaction() again"
        if state is ProducerTxnState.ABORTING:
            return "; the abort is not finished: call abort_transaction() again"
        if state is ProducerTxnState.PREPARING:
            return "; the prepare is not finished: call prepare_transaction() again"
        if state is ProducerTxnState.PREPARED_TRANSACTION:
            return ("; the transaction is prepared: end it with complete_transaction(), "
                    "commit_transaction() or abort_transaction()")
        if state is ProducerTxnState.COMPLETING:
            return ("; the completion's outcome is not known yet: call "
                    "complete_transaction() again with the same prepared state")
        return ""
