"""The transaction state machine of one transactional id (Kafka's
TransactionState and TransactionMetadata, with "transaction version 2" rules).

Every change is a new `TxnMetadata` value. A handler validates a request
against the current value and returns the value to persist (and the reply);
the runtime appends it to `__transaction_state`, and only then `replay()`
makes it current — live traffic and recovery run the same code.

Transaction version 2 (KIP-890): the producer epoch is bumped at every commit
and abort, so the markers of a transaction carry an epoch strictly above the
epoch of its data, and a delayed EndTxn or marker of an earlier transaction
can never complete a later one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from oncelog.errors import ErrorCode
from services.common.invariants import invariant
from services.common.service_error import ServiceError

# Epochs are int16 on the wire. The last usable value is kept free so that an
# epoch bump for fencing is always possible; at it, the producer id rotates.
MAX_PRODUCER_EPOCH = 32767 - 1
NO_PRODUCER_ID = -1


class TxnState(enum.Enum):
    """States of a transactional id. Each state's doc says how it answers each
    request (action) and where it can go (transition)."""

    EMPTY = "Empty"
    """No transaction open.
    action: InitProducerId bumps the epoch; AddPartitions opens a transaction;
    EndTxn(commit) is INVALID_TXN_STATE; EndTxn(abort) bumps the epoch (v2).
    transition: Ongoing, PrepareAbort (v2 empty abort), Dead (expiry)."""

    ONGOING = "Ongoing"
    """A transaction is open with partitions (and maybe a group's offsets).
    action: AddPartitions adds; EndTxn prepares; InitProducerId aborts it and
    fences the old producer; the timeout aborts it with an epoch bump.
    transition: PrepareCommit, PrepareAbort, PrepareEpochFence."""

    PREPARE_COMMIT = "PrepareCommit"
    """The commit is decided and durable; markers are in flight.
    action: everything but a retried EndTxn(commit) answers CONCURRENT_TRANSACTIONS.
    transition: CompleteCommit once every marker has landed."""

    PREPARE_ABORT = "PrepareAbort"
    """The abort is decided and durable; markers are in flight.
    action: as PrepareCommit, for abort.
    transition: CompleteAbort once every marker has landed."""

    COMPLETE_COMMIT = "CompleteCommit"
    """The last transaction committed and every marker landed.
    action: as Empty; a retried EndTxn(commit) of the last epoch succeeds.
    transition: Ongoing, PrepareAbort (v2 empty abort), Dead."""

    COMPLETE_ABORT = "CompleteAbort"
    """The last transaction aborted and every marker landed.
    action: as Empty; a retried EndTxn(abort) of the last epoch succeeds.
    transition: Ongoing, PrepareAbort (v2 empty abort), Dead."""

    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    """An Ongoing transaction is being aborted because a new producer instance
    called InitProducerId; the epoch is bumped before the abort.
    transition: PrepareAbort."""

    DEAD = "Dead"
    """The transactional id expired; its record is a tombstone.
    action: every request sees an unknown transactional id.
    transition: none (a new InitProducerId starts over from nothing)."""

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


# The one table of allowed transitions: state -> the states it may be entered from.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset(
        {TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.ONGOING: frozenset(
        {TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset(
        {TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE, TxnState.EMPTY,
         TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
    TxnState.DEAD: frozenset(
        {TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
}


def check_transition(current: TxnState, target: TxnState, transactional_id: str) -> None:
    """Crashes on a transition the table does not allow: handlers only ask for
    allowed ones, so a refusal here is a bug, not bad input."""
    invariant(
        current in VALID_PREVIOUS[target],
        lambda: f"transactional id {transactional_id!r}: illegal transition "
        f"{current.value} -> {target.value}",
    )


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """Everything the coordinator knows of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    # The id and epoch before the last bump or rotation: lets a retried EndTxn
    # or InitProducerId whose reply was lost be recognised.
    previous_producer_id: int
    previous_producer_epoch: int
    txn_timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    # When the open transaction added its first partition (-1: none open).
    txn_start_ms: int = -1
    last_update_ms: int = 0
    # Why the epoch last moved: "end_txn" (the producer's own commit/abort, so
    # a retry from the previous epoch is legitimate), "init" (a new instance
    # fenced the old one) or "timeout" (the coordinator fenced a late producer).
    bump_reason: str = ""

    def transition(self, target: TxnState, **changes: object) -> TxnMetadata:
        check_transition(self.state, target, self.transactional_id)
        return replace(self, state=target, **changes)  # type: ignore[arg-type]

    def to_payload(self) -> dict[str, object]:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "previous_producer_id": self.previous_producer_id,
            "previous_producer_epoch": self.previous_producer_epoch,
            "txn_timeout_ms": self.txn_timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "txn_start_ms": self.txn_start_ms,
            "last_update_ms": self.last_update_ms,
            "bump_reason": self.bump_reason,
        }

    @staticmethod
    def from_payload(transactional_id: str, payload: dict[str, Any]) -> TxnMetadata:
        parts = payload["partitions"]
        invariant(isinstance(parts, list), "partitions must be a list")
        return TxnMetadata(
            transactional_id=transactional_id,
            producer_id=int(payload["producer_id"]),
            producer_epoch=int(payload["producer_epoch"]),
            previous_producer_id=int(payload["previous_producer_id"]),
            previous_producer_epoch=int(payload["previous_producer_epoch"]),
            txn_timeout_ms=int(payload["txn_timeout_ms"]),
            state=TxnState(payload["state"]),
            partitions=frozenset((str(t), int(p)) for t, p in parts),
            txn_start_ms=int(payload["txn_start_ms"]),
            last_update_ms=int(payload["last_update_ms"]),
            bump_reason=str(payload.get("bump_reason", "")),
        )


def _fenced(md: TxnMetadata, producer_id: int, producer_epoch: int) -> ServiceError:
    return ServiceError(
        ErrorCode.PRODUCER_FENCED,
        f"transactional id {md.transactional_id!r}: producer {producer_id} epoch "
        f"{producer_epoch} is fenced; the current epoch is {md.producer_epoch}",
    )


def _check_producer(md: TxnMetadata | None, transactional_id: str, producer_id: int,
                    producer_epoch: int) -> TxnMetadata:
    """The id must be known and the caller must hold its current id and epoch."""
    if md is None or md.state is TxnState.DEAD:
        raise ServiceError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"transactional id {transactional_id!r} is unknown or expired; "
            "call init_transactions again",
        )
    if producer_id != md.producer_id:
        raise ServiceError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"transactional id {transactional_id!r} maps to producer {md.producer_id}, "
            f"not {producer_id}",
        )
    if producer_epoch != md.producer_epoch:
        raise _fenced(md, producer_id, producer_epoch)
    return md


@dataclass(frozen=True, slots=True)
class InitPlan:
    """The outcome of InitProducerId: what to persist, and the ids to answer
    with, or that an open transaction must first be aborted (the client gets
    CONCURRENT_TRANSACTIONS and retries)."""

    to_persist: TxnMetadata
    abort_started: bool


def plan_init_producer_id(
    md: TxnMetadata | None,
    *,
    transactional_id: str,
    txn_timeout_ms: int,
    max_txn_timeout_ms: int,
    now_ms: int,
    fresh_producer_id: int | None,
) -> InitPlan:
    """InitProducerId for a transactional id.

    `fresh_producer_id` is a newly allocated id for the cases that need one (a
    new transactional id, epoch exhaustion); the runtime allocates it when
    `needs_fresh_producer_id` says so.
    """
    if not 0 < txn_timeout_ms <= max_txn_timeout_ms:
        raise ServiceError(
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {txn_timeout_ms} ms is outside 1..{max_txn_timeout_ms} ms",
        )
    if md is None or md.state is TxnState.DEAD:
        invariant(fresh_producer_id is not None, "a new transactional id needs a producer id")
        return InitPlan(
            TxnMetadata(
                transactional_id=transactional_id,
                producer_id=fresh_producer_id,  # type: ignore[arg-type]
                producer_epoch=0,
                previous_producer_id=NO_PRODUCER_ID,
                previous_producer_epoch=-1,
                txn_timeout_ms=txn_timeout_ms,
                state=TxnState.EMPTY,
                last_update_ms=now_ms,
            ),
            abort_started=False,
        )
    if md.state.is_prepare or md.state is TxnState.PREPARE_EPOCH_FENCE:
        raise ServiceError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"transactional id {transactional_id!r} is completing a transaction "
            f"({md.state.value}); retry",
        )
    if md.state is TxnState.ONGOING:
        # Fence the previous instance and abort what it left open. The new
        # producer retries InitProducerId once the abort has completed.
        return InitPlan(_bump_epoch(md, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, "init"),
                        abort_started=True)
    bumped = _bump_epoch(md, TxnState.EMPTY, now_ms, fresh_producer_id, "init")
    return InitPlan(replace(bumped, txn_timeout_ms=txn_timeout_ms), abort_started=False)


def needs_fresh_producer_id(md: TxnMetadata | None) -> bool:
    """Whether the next epoch bump of this id needs a newly allocated producer id."""
    return md is None or md.state is TxnState.DEAD or md.producer_epoch >= MAX_PRODUCER_EPOCH


def _bump_epoch(md: TxnMetadata, target: TxnState, now_ms: int,
                fresh_producer_id: int | None, reason: str) -> TxnMetadata:
    if md.producer_epoch >= MAX_PRODUCER_EPOCH:
        # Epoch exhaustion: rotate to a new producer id (epoch 0).
        invariant(fresh_producer_id is not None, "epoch exhaustion needs a fresh producer id")
        producer_id, producer_epoch = fresh_producer_id, 0
    else:
        producer_id, producer_epoch = md.producer_id, md.producer_epoch + 1
    return md.transition(
        target,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        previous_producer_id=md.producer_id,
        previous_producer_epoch=md.producer_epoch,
        last_update_ms=now_ms,
        bump_reason=reason,
    )


def plan_add_partitions(
    md: TxnMetadata | None,
    *,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: frozenset[tuple[str, int]],
    max_partitions: int,
    now_ms: int,
) -> TxnMetadata | None:
    """AddPartitionsToTxn / AddOffsetsToTxn: the metadata to persist, or None
    when every partition is already in the open transaction."""
    current = _check_producer(md, transactional_id, producer_id, producer_epoch)
    if current.state.is_prepare or current.state is TxnState.PREPARE_EPOCH_FENCE:
        raise ServiceError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"transactional id {transactional_id!r} is completing its previous transaction "
            f"({current.state.value}); retry",
        )
    if current.state is TxnState.ONGOING and partitions <= current.partitions:
        return None
    merged = (current.partitions if current.state is TxnState.ONGOING else frozenset()) | partitions
    if len(merged) > max_partitions:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"transactional id {transactional_id!r}: a transaction may span at most "
            f"{max_partitions} partitions, this one would span {len(merged)}",
        )
    start_ms = current.txn_start_ms if current.state is TxnState.ONGOING else now_ms
    return current.transition(
        TxnState.ONGOING, partitions=merged, txn_start_ms=start_ms, last_update_ms=now_ms
    )


@dataclass(frozen=True, slots=True)
class EndPlan:
    """The outcome of EndTxn: metadata to persist (None for an idempotent
    retry) and the producer id and epoch to answer with."""

    to_persist: TxnMetadata | None
    producer_id: int
    producer_epoch: int


def plan_end_txn(
    md: TxnMetadata | None,
    *,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    now_ms: int,
    fresh_producer_id: int | None,
) -> EndPlan:
    """EndTxn(commit|abort), with v2's epoch bump and retry detection."""
    if md is None or md.state is TxnState.DEAD:
        _check_producer(md, transactional_id, producer_id, producer_epoch)
        raise AssertionError("unreachable")  # pragma: no cover
    wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    # A retry whose first reply was lost: the caller still holds the epoch
    # from before this transaction's bump.
    is_retry = (
        md.bump_reason == "end_txn"
        and producer_id == md.previous_producer_id
        and producer_epoch == md.previous_producer_epoch
        and (md.state.is_prepare or md.state.is_complete)
    )
    if is_retry:
        if md.state in (wanted_prepare, wanted_complete):
            return EndPlan(None, md.producer_id, md.producer_epoch)
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r}: cannot "
            f"{'commit' if commit else 'abort'} a transaction that is {md.state.value}",
        )
    current = _check_producer(md, transactional_id, producer_id, producer_epoch)
    if current.state.is_prepare or current.state is TxnState.PREPARE_EPOCH_FENCE:
        raise ServiceError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"transactional id {transactional_id!r} is completing a transaction "
            f"({current.state.value}); retry",
        )
    if current.state is TxnState.ONGOING:
        bumped = _bump_epoch(current, wanted_prepare, now_ms, fresh_producer_id, "end_txn")
        return EndPlan(bumped, bumped.producer_id, bumped.producer_epoch)
    # Empty or Complete*: nothing open.
    if commit:
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r} has no open transaction to commit "
            f"({current.state.value})",
        )
    # v2: aborting with nothing open still bumps the epoch, so a producer can
    # always recover from an abortable error with a fresh epoch.
    bumped = _bump_epoch(current, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, "end_txn")
    return EndPlan(replace(bumped, partitions=frozenset()), bumped.producer_id,
                   bumped.producer_epoch)


def plan_complete(md: TxnMetadata, *, now_ms: int) -> TxnMetadata:
    """Prepare* -> Complete* once every marker has landed."""
    target = (TxnState.COMPLETE_COMMIT if md.state is TxnState.PREPARE_COMMIT
              else TxnState.COMPLETE_ABORT)
    return md.transition(target, partitions=frozenset(), txn_start_ms=-1, last_update_ms=now_ms)


def plan_timeout_abort(md: TxnMetadata, *, now_ms: int,
                       fresh_producer_id: int | None) -> TxnMetadata | None:
    """An Ongoing transaction past its timeout is aborted with an epoch bump, so
    the late producer is fenced. None when it has not timed out."""
    if md.state is not TxnState.ONGOING or now_ms < md.txn_start_ms + md.txn_timeout_ms:
        return None
    return _bump_epoch(md, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, "timeout")


def plan_expire(md: TxnMetadata, *, now_ms: int, expiration_ms: int) -> bool:
    """Whether an idle transactional id has expired (its record becomes a tombstone)."""
    idle = md.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    return idle and now_ms - md.last_update_ms >= expiration_ms


def marker_target(md: TxnMetadata) -> tuple[int, int]:
    """The producer id and epoch the markers of a Prepare* transaction carry.

    Normally the bumped epoch. When EndTxn rotated the producer id (epoch
    exhaustion), the transaction's data was written under the previous id, so
    the markers go to that id with an epoch one above its last one.
    """
    invariant(md.state.is_prepare, lambda: f"markers for a {md.state.value} transaction")
    if md.producer_id != md.previous_producer_id and md.previous_producer_id != NO_PRODUCER_ID \
            and md.producer_epoch == 0:
        return md.previous_producer_id, md.previous_producer_epoch + 1
    return md.producer_id, md.producer_epoch
