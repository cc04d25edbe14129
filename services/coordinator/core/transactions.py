"""The transaction state machine of one transactional id (Kafka's
TransactionState and TransactionMetadata, with "transaction version 2" rules,
and version 1 for Kafka's clients).

Every change is a new `TxnMetadata` value. A handler validates a request
against the current value and returns the value to persist (and the reply);
the runtime appends it to `__transaction_state`, and only then `replay()`
makes it current — live traffic and recovery run the same code.

Transaction version 2 (KIP-890): the producer epoch is bumped at every commit
and abort, so the markers of a transaction carry an epoch strictly above the
epoch of its data, and a delayed EndTxn or marker of an earlier transaction
can never complete a later one.

Transaction version 1 (Kafka's coordinator before KIP-890 part 2), chosen at
InitProducerId for Kafka's clients, which keep their epoch across
transactions: EndTxn decides without a bump and answers the same epoch, the
markers carry the data's epoch, and only a fence (the timeout, a new
instance, the admin abort, KIP-360 recovery) bumps it. Each decision also
stamps its markers with a timestamp that strictly increases per
transactional id, so that a store can tell a delayed marker of an earlier
transaction from the next one's at the same epoch. The same table and the
same planners serve both versions: the version is a field of the metadata.

Participation in an external two-phase commit (KIP-939): a producer
initialized with two-phase commit may *prepare* its transaction (state
Prepared): its writes are flushed and its outcome now belongs to an outside
coordinator (Spark's driver, say). A prepared transaction never times out,
survives its producer (a new instance keeps it with keep_prepared_txn) and
is completed by whoever holds the transactional id then: committed when the
prepared state it is given — the producer id and epoch of the prepared
transaction's data — matches, aborted otherwise. docs/coordinator.md, "Two-
phase commit".
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from oncelog.wire.errors import ErrorCode
from oncelog.wire.vocabulary import TransactionState

from ...common.kernel.errors import ServiceError
from ...common.kernel.invariants import invariant

# Epochs are int16 on the wire. The last usable value is kept free so that an
# epoch bump for fencing is always possible; at it, the producer id rotates.
MAX_PRODUCER_EPOCH = 32767 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


class TransactionVersion(enum.IntEnum):
    """The transaction protocol a producer speaks, chosen at InitProducerId
    and kept with its transactional id (docs/coordinator.md, "Transaction
    versions")."""

    V1 = 1
    """Kafka's clients (EndTxn v0-v4): EndTxn keeps the epoch; markers carry
    the data's epoch, stamped with the decision's timestamp."""

    V2 = 2
    """KIP-890 part 2, the SDK's: EndTxn bumps the epoch; markers carry an
    epoch strictly above the data's."""


def parse_transaction_version(value: int) -> TransactionVersion:
    """The version an InitProducerId asks for: 0 (unset) is version 2, so that
    every caller from before versions existed is unchanged."""
    if value == 0:
        return TransactionVersion.V2
    try:
        return TransactionVersion(value)
    except ValueError:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"transaction_version {value} is unknown; expected 1, 2 or 0 (version 2)",
        ) from None


# The values are the wire's shared vocabulary (oncelog.wire.vocabulary), the
# names DescribeTransactions/DescribeGroups report.
class TxnState(enum.StrEnum):
    """States of a transactional id. Each state's doc says how it answers each
    request (action) and where it can go (transition)."""

    EMPTY = TransactionState.EMPTY.value
    """No transaction open.
    action: InitProducerId bumps the epoch; AddPartitions opens a transaction;
    EndTxn(commit) is INVALID_TXN_STATE; EndTxn(abort) bumps the epoch (v2),
    is INVALID_TXN_STATE (v1); PrepareTransaction (two-phase commit) prepares an empty transaction;
    CompleteTransaction answers from the last prepared transaction's outcome.
    transition: Ongoing, Prepared, PrepareAbort (v2 empty abort), Dead (expiry)."""

    ONGOING = TransactionState.ONGOING.value
    """A transaction is open with partitions (and maybe a group's offsets).
    action: AddPartitions adds; EndTxn decides (v2: with an epoch bump; v1:
    keeping the epoch); PrepareTransaction (two-phase
    commit) prepares it; InitProducerId aborts it and fences the old producer
    (also with keep_prepared_txn: it was never prepared); the timeout aborts
    it with an epoch bump, unless the producer uses two-phase commit.
    transition: Prepared, PrepareCommit, PrepareAbort, PrepareEpochFence."""

    PREPARED = TransactionState.PREPARED.value
    """Two-phase commit (KIP-939): the producer flushed every write and
    prepared the transaction; an external coordinator decides its outcome.
    action: CompleteTransaction commits it if the given prepared state
    matches, else aborts it; EndTxn commits or aborts it; InitProducerId with
    keep_prepared_txn keeps it and fences the old producer (epoch bump),
    without it aborts it; a retried PrepareTransaction succeeds;
    AddPartitions and the stores' verification are refused (nothing more may
    be written); the timeout never applies; the admin abort aborts it.
    transition: Prepared (kept by a new instance), PrepareCommit, PrepareAbort."""

    PREPARE_COMMIT = TransactionState.PREPARE_COMMIT.value
    """The commit is decided and durable; markers are in flight.
    action: everything but a retried EndTxn(commit) answers CONCURRENT_TRANSACTIONS
    (v1: EndTxn(abort) is INVALID_TXN_STATE, EndTxn(commit) CONCURRENT_TRANSACTIONS).
    transition: CompleteCommit once every marker has landed."""

    PREPARE_ABORT = TransactionState.PREPARE_ABORT.value
    """The abort is decided and durable; markers are in flight.
    action: as PrepareCommit, for abort.
    transition: CompleteAbort once every marker has landed."""

    COMPLETE_COMMIT = TransactionState.COMPLETE_COMMIT.value
    """The last transaction committed and every marker landed.
    action: as Empty; a retried EndTxn(commit) of the last epoch succeeds (v1:
    EndTxn(commit) of the current epoch succeeds, EndTxn(abort) is
    INVALID_TXN_STATE).
    transition: Ongoing, Prepared, PrepareAbort (v2 empty abort), Dead."""

    COMPLETE_ABORT = TransactionState.COMPLETE_ABORT.value
    """The last transaction aborted and every marker landed.
    action: as Empty; a retried EndTxn(abort) of the last epoch succeeds (v1:
    EndTxn(abort) of the current epoch succeeds, EndTxn(commit) is
    INVALID_TXN_STATE).
    transition: Ongoing, Prepared, PrepareAbort (v2 empty abort), Dead."""

    PREPARE_EPOCH_FENCE = TransactionState.PREPARE_EPOCH_FENCE.value
    """An Ongoing transaction is being aborted because a new producer instance
    called InitProducerId; the epoch is bumped before the abort.
    transition: PrepareAbort."""

    DEAD = TransactionState.DEAD.value
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
    TxnState.PREPARED: frozenset(
        {TxnState.ONGOING, TxnState.PREPARED, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
         TxnState.COMPLETE_ABORT}
    ),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING, TxnState.PREPARED}),
    TxnState.PREPARE_ABORT: frozenset(
        {TxnState.ONGOING, TxnState.PREPARED, TxnState.PREPARE_EPOCH_FENCE, TxnState.EMPTY,
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
    transaction_timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    # When the open transaction added its first partition (-1: none open).
    txn_start_ms: int = -1
    last_update_ms: int = 0
    # Why the epoch last moved: "end_txn" (the producer's own commit/abort or
    # completion of a prepared transaction, so a retry from the previous epoch
    # is legitimate), "init" (a new instance fenced the old one), "timeout"
    # (the coordinator fenced a late producer), "admin" (an operator's abort)
    # or "recover" (KIP-360: the producer bumped its own epoch to recover from
    # an abortable error, so a retry from the previous epoch is legitimate).
    bump_reason: str = ""
    # The producer initialized with two-phase commit (KIP-939): its
    # transactions never time out, and it may prepare them.
    two_phase_commit: bool = False
    # The prepared state of the transaction that is Prepared, or of the last
    # one that was (kept so that a repeated completion can be answered): the
    # producer id and epoch its data was written with; and how it ended
    # ("commit", "abort"; "" while it is Prepared).
    prepared_producer_id: int = NO_PRODUCER_ID
    prepared_producer_epoch: int = -1
    prepared_outcome: str = ""
    # In a Prepare* record: the producer id and epoch its markers carry,
    # named when the outcome was decided (see `_decide`).
    marker_producer_id: int = NO_PRODUCER_ID
    marker_producer_epoch: int = -1
    # In a Prepare* record (kept after): the epoch the decided transaction's
    # data was written with, under marker_producer_id. A store holding that
    # transaction open asks about it by this (core/hanging.py). -1: a record
    # from before the field existed.
    decided_producer_epoch: int = -1
    # The transaction protocol of the producer, from its InitProducerId.
    transaction_version: TransactionVersion = TransactionVersion.V2
    # The timestamp of the last decision (set in its Prepare* record, kept
    # after): version-1 markers carry it, and it strictly increases over the
    # decisions of the id, whatever the clocks of the coordinators that made
    # them (see `_decide`). -1: never decided.
    decision_timestamp_ms: int = -1

    def transition(self, target: TxnState, **changes: object) -> TxnMetadata:
        check_transition(self.state, target, self.transactional_id)
        return replace(self, state=target, **changes)  # type: ignore[arg-type]

    @property
    def prepared_state(self) -> tuple[int, int] | None:
        """(producer id, epoch) of the prepared (or last prepared) transaction."""
        if self.prepared_producer_id == NO_PRODUCER_ID:
            return None
        return self.prepared_producer_id, self.prepared_producer_epoch

    def to_payload(self) -> dict[str, object]:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "previous_producer_id": self.previous_producer_id,
            "previous_producer_epoch": self.previous_producer_epoch,
            # The stored key keeps its first name: records already written use it.
            "txn_timeout_ms": self.transaction_timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "txn_start_ms": self.txn_start_ms,
            "last_update_ms": self.last_update_ms,
            "bump_reason": self.bump_reason,
            "two_phase_commit": self.two_phase_commit,
            "prepared_producer_id": self.prepared_producer_id,
            "prepared_producer_epoch": self.prepared_producer_epoch,
            "prepared_outcome": self.prepared_outcome,
            "marker_producer_id": self.marker_producer_id,
            "marker_producer_epoch": self.marker_producer_epoch,
            "decided_producer_epoch": self.decided_producer_epoch,
            "transaction_version": int(self.transaction_version),
            "decision_timestamp_ms": self.decision_timestamp_ms,
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
            transaction_timeout_ms=int(payload["txn_timeout_ms"]),
            state=TxnState(payload["state"]),
            partitions=frozenset((str(t), int(p)) for t, p in parts),
            txn_start_ms=int(payload["txn_start_ms"]),
            last_update_ms=int(payload["last_update_ms"]),
            bump_reason=str(payload.get("bump_reason", "")),
            # Absent from records written before two-phase commit existed.
            two_phase_commit=bool(payload.get("two_phase_commit", False)),
            prepared_producer_id=int(payload.get("prepared_producer_id", NO_PRODUCER_ID)),
            prepared_producer_epoch=int(payload.get("prepared_producer_epoch", -1)),
            prepared_outcome=str(payload.get("prepared_outcome", "")),
            marker_producer_id=int(payload.get("marker_producer_id", NO_PRODUCER_ID)),
            marker_producer_epoch=int(payload.get("marker_producer_epoch", -1)),
            decided_producer_epoch=int(payload.get("decided_producer_epoch", -1)),
            # Records from before transaction versions were version 2.
            transaction_version=TransactionVersion(int(payload.get("transaction_version", 2))),
            decision_timestamp_ms=int(payload.get("decision_timestamp_ms", -1)),
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
    CONCURRENT_TRANSACTIONS and retries). `kept_prepared` is the prepared
    state of a transaction kept with keep_prepared_txn (None otherwise).
    `persist` False: nothing changes; `to_persist` is the current state,
    whose ids answer a KIP-360 retry in the middle of a transaction."""

    to_persist: TxnMetadata
    abort_started: bool
    kept_prepared: tuple[int, int] | None = None
    persist: bool = True


def _in_flight(md: TxnMetadata, transactional_id: str) -> ServiceError | None:
    """CONCURRENT_TRANSACTIONS while a decided transaction's markers are out."""
    if md.state.is_prepare or md.state is TxnState.PREPARE_EPOCH_FENCE:
        return ServiceError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"transactional id {transactional_id!r} is completing a transaction "
            f"({md.state.value}); retry",
        )
    return None


def plan_init_producer_id(
    md: TxnMetadata | None,
    *,
    transactional_id: str,
    transaction_timeout_ms: int,
    max_transaction_timeout_ms: int,
    now_ms: int,
    fresh_producer_id: int | None,
    two_phase_commit: bool = False,
    keep_prepared_txn: bool = False,
    transaction_version: TransactionVersion = TransactionVersion.V2,
    expected: tuple[int, int] | None = None,
) -> InitPlan:
    """InitProducerId for a transactional id.

    `fresh_producer_id` is a newly allocated id for the cases that need one (a
    new transactional id, epoch exhaustion); the runtime allocates it when
    `needs_fresh_producer_id` says so. `two_phase_commit`: the producer takes
    part in an external two-phase commit (its transactions never time out);
    `keep_prepared_txn` (which needs it): a Prepared transaction is kept, not
    aborted, for this instance to complete. `transaction_version`: the
    protocol the producer speaks from now on.

    `expected` (KIP-360): the producer id and epoch the caller holds, None
    for a new instance. As Kafka's coordinator: the epoch is bumped only if
    they are the current ones; the ids from before the last KIP-360 bump
    are a retry whose answer was lost and get the current ids again;
    anything else is PRODUCER_FENCED (a zombie must not bump the epoch of
    the instance that fenced it). Stricter than Kafka, whose coordinator
    aborts an open transaction for any caller naming the right producer id.
    """
    if transaction_version is TransactionVersion.V1 and two_phase_commit:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"transactional id {transactional_id!r}: two-phase commit needs transaction "
            "version 2, not 1",
        )
    if keep_prepared_txn and not two_phase_commit:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"transactional id {transactional_id!r}: keep_prepared_txn needs "
            "enable_two_phase_commit",
        )
    if not 0 < transaction_timeout_ms <= max_transaction_timeout_ms:
        raise ServiceError(
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {transaction_timeout_ms} ms is outside "
            f"1..{max_transaction_timeout_ms} ms",
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
                transaction_timeout_ms=transaction_timeout_ms,
                state=TxnState.EMPTY,
                last_update_ms=now_ms,
                two_phase_commit=two_phase_commit,
                transaction_version=transaction_version,
            ),
            abort_started=False,
        )
    busy = _in_flight(md, transactional_id)
    if busy is not None:
        raise busy
    reason = "init"
    if expected is not None:
        if _is_recovery_retry(md, expected):
            if md.state in (TxnState.ONGOING, TxnState.PREPARED):
                # The producer has gone on with the epoch it recovered to: a
                # late copy of its request changes nothing.
                return InitPlan(md, abort_started=False, persist=False)
            return InitPlan(md.transition(
                TxnState.EMPTY, last_update_ms=now_ms,
                transaction_timeout_ms=transaction_timeout_ms,
                two_phase_commit=two_phase_commit, transaction_version=transaction_version,
            ), abort_started=False)
        if expected != (md.producer_id, md.producer_epoch):
            raise ServiceError(
                ErrorCode.PRODUCER_FENCED,
                f"transactional id {transactional_id!r}: producer {expected[0]} epoch "
                f"{expected[1]} cannot recover; the current producer is {md.producer_id} "
                f"epoch {md.producer_epoch} (another instance took over)",
            )
        reason = "recover"
    if md.state is TxnState.PREPARED and keep_prepared_txn:
        # Fence the instance that prepared it; the transaction stays, with its
        # data under the prepared state, for this instance to complete.
        kept = _bump_epoch(md, TxnState.PREPARED, now_ms, fresh_producer_id, reason)
        return InitPlan(kept, abort_started=False, kept_prepared=md.prepared_state)
    if md.state in (TxnState.ONGOING, TxnState.PREPARED):
        # Fence the previous instance and abort what it left open (an Ongoing
        # transaction is aborted even with keep_prepared_txn: it was never
        # prepared, so nobody holds its prepared state). The new producer
        # retries InitProducerId once the abort has completed. The abort
        # keeps the aborted transaction's version; the retry sets the new one.
        return InitPlan(_decide(md, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, reason),
                        abort_started=True)
    bumped = _bump_epoch(md, TxnState.EMPTY, now_ms, fresh_producer_id, reason)
    return InitPlan(replace(bumped, transaction_timeout_ms=transaction_timeout_ms,
                            two_phase_commit=two_phase_commit,
                            transaction_version=transaction_version), abort_started=False)


def _is_recovery_retry(md: TxnMetadata, expected: tuple[int, int]) -> bool:
    """A KIP-360 InitProducerId naming the ids from before the last bump,
    which was itself a KIP-360 recovery: its answer was lost (Kafka keeps the
    last epoch only for such bumps; a new instance's bump forgets it, so a
    fenced instance cannot pass for a retry)."""
    return md.bump_reason == "recover" and expected == (
        md.previous_producer_id, md.previous_producer_epoch)


def parse_expected_producer(producer_id: int | None, producer_epoch: int | None,
                            *, transactional_id: str) -> tuple[int, int] | None:
    """KIP-360's (producer id, epoch) of an InitProducerId, as Kafka reads
    them: both unset or both -1 is a new instance (None); one of them -1 is
    INVALID_REQUEST."""
    pid = NO_PRODUCER_ID if producer_id is None else producer_id
    epoch = NO_PRODUCER_EPOCH if producer_epoch is None else producer_epoch
    if pid == NO_PRODUCER_ID and epoch == NO_PRODUCER_EPOCH:
        return None
    if pid < 0 or not 0 <= epoch <= MAX_PRODUCER_EPOCH + 1:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"transactional id {transactional_id!r}: InitProducerId names producer {pid} "
            f"epoch {epoch}; expected both -1 (a new instance) or a producer id >= 0 with "
            f"an epoch in 0..{MAX_PRODUCER_EPOCH + 1}",
        )
    return pid, epoch


def needs_fresh_producer_id(md: TxnMetadata | None, *, end_txn: bool = False) -> bool:
    """Whether the next epoch bump of this id needs a newly allocated producer
    id. `end_txn`: the bump an EndTxn would make, which version 1 never makes."""
    if end_txn and md is not None and md.transaction_version is TransactionVersion.V1:
        return False
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


def _decide(md: TxnMetadata, target: TxnState, now_ms: int, fresh_producer_id: int | None,
            reason: str) -> TxnMetadata:
    """Decides the open transaction (or an empty one): Prepare*, the producer
    id and epoch its markers carry, and the decision's timestamp.

    Version 2, and every fence (`reason` other than "end_txn") in version 1:
    the epoch is bumped. Markers go to the producer id the transaction's data
    was written with, at an epoch strictly above the data's: normally the
    bumped epoch. The data was written with the prepared state when the
    transaction is Prepared (a new instance that kept it holds a later
    epoch); and when the bump rotated the producer id (epoch exhaustion), the
    markers stay on the data's id at the epoch one above the data's.

    Version 1's own EndTxn: no bump; the markers carry the data's id and
    epoch, which the producer keeps using.

    The timestamp is the clock's, or one above the last decision's when the
    clock is behind it (another coordinator's clock, or a step back), so that
    it strictly increases over the id's decisions: a store compares the
    timestamps of version-1 markers of one epoch to refuse a delayed one.
    """
    invariant(target.is_prepare, lambda: f"deciding into {target.value}")
    data_pid, data_epoch = (md.prepared_state if md.state is TxnState.PREPARED
                            else None) or (md.producer_id, md.producer_epoch)
    if md.transaction_version is TransactionVersion.V1 and reason == "end_txn":
        invariant(md.state is not TxnState.PREPARED,
                  lambda: f"transactional id {md.transactional_id!r}: a version-1 producer "
                  "holds a prepared transaction")
        decided = md.transition(target, last_update_ms=now_ms)
        marker_epoch = data_epoch
    else:
        decided = _bump_epoch(md, target, now_ms, fresh_producer_id, reason)
        marker_epoch = (decided.producer_epoch if decided.producer_id == data_pid
                        else data_epoch + 1)
    outcome = md.prepared_outcome
    if md.state is TxnState.PREPARED:
        outcome = "commit" if target is TxnState.PREPARE_COMMIT else "abort"
    return replace(decided, marker_producer_id=data_pid, marker_producer_epoch=marker_epoch,
                   decided_producer_epoch=data_epoch, prepared_outcome=outcome,
                   decision_timestamp_ms=max(now_ms, md.decision_timestamp_ms + 1))


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
    busy = _in_flight(current, transactional_id)
    if busy is not None:
        raise busy
    if current.state is TxnState.PREPARED:
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r}: the transaction is prepared; nothing "
            "can join it (complete it first)",
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
    retry) and the producer id and epoch to answer with. `confirm_owner`:
    the success is answered from memory and, unlike a version-2 retry, is
    not final by itself (see plan_end_txn): the runtime must first confirm
    that memory is the log's state."""

    to_persist: TxnMetadata | None
    producer_id: int
    producer_epoch: int
    confirm_owner: bool = False


def _is_end_retry(md: TxnMetadata, producer_id: int, producer_epoch: int) -> bool:
    """A retried EndTxn or CompleteTransaction whose first reply was lost: the
    caller still holds the epoch from before the decision's bump."""
    return (
        md.bump_reason == "end_txn"
        and producer_id == md.previous_producer_id
        and producer_epoch == md.previous_producer_epoch
        and (md.state.is_prepare or md.state.is_complete)
    )


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
    """EndTxn(commit|abort). A Prepared transaction is decided as an Ongoing
    one is.

    Version 2: the decision bumps the epoch; a retry whose answer was lost
    comes from the epoch before it and gets the decision's ids again.

    Version 1 (Kafka's coordinator before KIP-890 part 2): the decision keeps
    the epoch, so a retry comes with the current one. After the decision, the
    same outcome is CONCURRENT_TRANSACTIONS while its markers are in flight
    and success once they have landed (same ids); the other outcome is
    INVALID_TXN_STATE; with nothing open, INVALID_TXN_STATE. Such a success
    is answered from memory, and a zombie coordinator's memory may say
    "completed" for what the log has since opened as the next transaction,
    whose commit would then be acknowledged and never made: the runtime
    confirms ownership first (`confirm_owner`)."""
    if md is None or md.state is TxnState.DEAD:
        _check_producer(md, transactional_id, producer_id, producer_epoch)
        raise AssertionError("unreachable")  # pragma: no cover
    wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    if md.transaction_version is TransactionVersion.V1:
        current = _check_producer(md, transactional_id, producer_id, producer_epoch)
        if current.state.is_prepare or current.state.is_complete:
            if current.state not in (wanted_prepare, wanted_complete):
                raise ServiceError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"transactional id {transactional_id!r}: cannot "
                    f"{'commit' if commit else 'abort'} a transaction that is "
                    f"{current.state.value}",
                )
            busy = _in_flight(current, transactional_id)
            if busy is not None:
                raise busy
            return EndPlan(None, current.producer_id, current.producer_epoch,
                           confirm_owner=True)
    if md.transaction_version is TransactionVersion.V2 and \
            _is_end_retry(md, producer_id, producer_epoch):
        if md.state in (wanted_prepare, wanted_complete):
            return EndPlan(None, md.producer_id, md.producer_epoch)
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r}: cannot "
            f"{'commit' if commit else 'abort'} a transaction that is {md.state.value}",
        )
    current = _check_producer(md, transactional_id, producer_id, producer_epoch)
    busy = _in_flight(current, transactional_id)
    if busy is not None:
        raise busy
    if current.state in (TxnState.ONGOING, TxnState.PREPARED):
        decided = _decide(current, wanted_prepare, now_ms, fresh_producer_id, "end_txn")
        return EndPlan(decided, decided.producer_id, decided.producer_epoch)
    # Empty or Complete*: nothing open (version 1: Empty).
    if commit or current.transaction_version is TransactionVersion.V1:
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r} has no open transaction to "
            f"{'commit' if commit else 'abort'} ({current.state.value})",
        )
    # v2: aborting with nothing open still bumps the epoch, so a producer can
    # always recover from an abortable error with a fresh epoch.
    decided = _decide(current, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, "end_txn")
    return EndPlan(replace(decided, partitions=frozenset()), decided.producer_id,
                   decided.producer_epoch)


def plan_prepare(
    md: TxnMetadata | None,
    *,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    now_ms: int,
) -> TxnMetadata | None:
    """PrepareTransaction (two-phase commit): the producer has flushed every
    write of its transaction; from now on only a completion decides it. With
    nothing open, an empty transaction is prepared (so that it too can be
    completed by another process). None for a retry of a prepare that
    already holds. The prepared state is (producer_id, producer_epoch)."""
    current = _check_producer(md, transactional_id, producer_id, producer_epoch)
    if not current.two_phase_commit:
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r} was not initialized for two-phase commit "
            "(transaction_two_phase_commit_enable): it cannot prepare a transaction",
        )
    if current.state is TxnState.PREPARED:
        if current.prepared_state == (producer_id, producer_epoch):
            return None
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r} holds the prepared transaction "
            f"{current.prepared_state} of an earlier instance: complete it first",
        )
    busy = _in_flight(current, transactional_id)
    if busy is not None:
        raise busy
    start_ms = current.txn_start_ms if current.state is TxnState.ONGOING else now_ms
    return current.transition(
        TxnState.PREPARED, prepared_producer_id=producer_id,
        prepared_producer_epoch=producer_epoch, prepared_outcome="", txn_start_ms=start_ms,
        last_update_ms=now_ms,
    )


@dataclass(frozen=True, slots=True)
class CompletePlan:
    """The outcome of CompleteTransaction: metadata to persist (None when
    nothing changes), whether the given prepared transaction is committed,
    and the producer id and epoch to answer with."""

    to_persist: TxnMetadata | None
    committed: bool
    producer_id: int
    producer_epoch: int


def plan_complete_prepared(
    md: TxnMetadata | None,
    *,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    prepared: tuple[int, int],
    now_ms: int,
    fresh_producer_id: int | None,
) -> CompletePlan:
    """CompleteTransaction(prepared state): KIP-939's completeTransaction,
    decided at the coordinator. A Prepared transaction is committed when its
    prepared state equals `prepared` and aborted otherwise. With nothing
    prepared, a completion of the last prepared transaction is answered with
    how it ended (a repeated completion changes nothing); a retry whose
    first reply was lost is answered the same way. Anything else is
    INVALID_TXN_STATE."""
    if md is None or md.state is TxnState.DEAD:
        _check_producer(md, transactional_id, producer_id, producer_epoch)
        raise AssertionError("unreachable")  # pragma: no cover
    if _is_end_retry(md, producer_id, producer_epoch):
        return CompletePlan(None, _completed_commit(md, prepared), md.producer_id,
                            md.producer_epoch)
    current = _check_producer(md, transactional_id, producer_id, producer_epoch)
    busy = _in_flight(current, transactional_id)
    if busy is not None:
        raise busy
    if current.state is TxnState.PREPARED:
        match = current.prepared_state == prepared
        target = TxnState.PREPARE_COMMIT if match else TxnState.PREPARE_ABORT
        decided = _decide(current, target, now_ms, fresh_producer_id, "end_txn")
        return CompletePlan(decided, match, decided.producer_id, decided.producer_epoch)
    if current.state is TxnState.ONGOING:
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r}: the open transaction is not prepared "
            "(call prepare_transaction first)",
        )
    if current.prepared_state == prepared and current.prepared_outcome:
        return CompletePlan(None, _completed_commit(current, prepared), current.producer_id,
                            current.producer_epoch)
    last = ("none was ever prepared" if current.prepared_state is None else
            f"the last one was {current.prepared_state} and ended with "
            f"{current.prepared_outcome or 'nothing yet'}")
    raise ServiceError(
        ErrorCode.INVALID_TXN_STATE,
        f"transactional id {transactional_id!r} has no prepared transaction {prepared} to "
        f"complete; {last}",
    )


def _completed_commit(md: TxnMetadata, prepared: tuple[int, int]) -> bool:
    return md.prepared_state == prepared and md.prepared_outcome == "commit"


def plan_complete(md: TxnMetadata, *, now_ms: int) -> TxnMetadata:
    """Prepare* -> Complete* once every marker has landed."""
    target = (TxnState.COMPLETE_COMMIT if md.state is TxnState.PREPARE_COMMIT
              else TxnState.COMPLETE_ABORT)
    return md.transition(target, partitions=frozenset(), txn_start_ms=-1, last_update_ms=now_ms)


def verify_partitions(
    md: TxnMetadata | None, *, transactional_id: str, producer_id: int, producer_epoch: int,
    partitions: Iterable[tuple[str, int]],
) -> dict[tuple[str, int], ServiceError | None]:
    """A partition store's question before a producer's first transactional
    write to a partition: is it in this producer's open transaction? Per
    partition, None (yes) or why not. Only an Ongoing transaction takes
    writes: a Prepared one is flushed and closed to them, so a zombie task
    cannot add to it. The caller must have confirmed that `md` is the log's
    state (a zombie coordinator's memory is not; docs/coordinator.md)."""
    out: dict[tuple[str, int], ServiceError | None] = {}
    for tp in partitions:
        error: ServiceError | None = None
        if md is None or md.state is TxnState.DEAD or md.producer_id != producer_id:
            error = ServiceError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"transactional id {transactional_id!r} does not map to producer {producer_id}",
            )
        elif md.producer_epoch != producer_epoch:
            error = ServiceError(
                ErrorCode.PRODUCER_FENCED,
                f"producer {producer_id} epoch {producer_epoch} is fenced; current epoch "
                f"{md.producer_epoch}",
            )
        elif md.state is not TxnState.ONGOING or tp not in md.partitions:
            error = ServiceError(
                ErrorCode.INVALID_TXN_STATE,
                f"partition {tp[0]}-{tp[1]} is not in an open transaction of "
                f"{transactional_id!r} (state {md.state.value}); call AddPartitionsToTxn "
                "before writing",
            )
        out[tp] = error
    return out


def is_timed_out(md: TxnMetadata, now_ms: int) -> bool:
    """An Ongoing transaction past its timeout. A two-phase-commit producer's
    transactions never time out: an external coordinator decides them, and
    may take as long as it needs (KIP-939)."""
    return (md.state is TxnState.ONGOING and not md.two_phase_commit
            and now_ms >= md.txn_start_ms + md.transaction_timeout_ms)


def plan_timeout_abort(md: TxnMetadata, *, now_ms: int,
                       fresh_producer_id: int | None) -> TxnMetadata | None:
    """A transaction past its timeout is aborted with an epoch bump, so the
    late producer is fenced. None when it has not timed out."""
    if not is_timed_out(md, now_ms):
        return None
    return _decide(md, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, "timeout")


def plan_admin_abort(md: TxnMetadata | None, *, transactional_id: str, now_ms: int,
                     fresh_producer_id: int | None) -> TxnMetadata:
    """The hanging-transaction tool: aborts the open transaction (Ongoing, or
    Prepared for two-phase commit) now, fencing its producer as a new
    instance's InitProducerId would."""
    if md is None or md.state is TxnState.DEAD:
        raise ServiceError(
            ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
            f"transactional id {transactional_id!r} is unknown to its coordinator",
        )
    if md.state not in (TxnState.ONGOING, TxnState.PREPARED):
        raise ServiceError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {transactional_id!r} has no open transaction "
            f"({md.state.value})",
        )
    return _decide(md, TxnState.PREPARE_ABORT, now_ms, fresh_producer_id, "admin")


def plan_expire(md: TxnMetadata, *, now_ms: int, expiration_ms: int) -> bool:
    """Whether an idle transactional id has expired (its record becomes a tombstone)."""
    idle = md.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    return idle and now_ms - md.last_update_ms >= expiration_ms


def marker_timestamp(md: TxnMetadata) -> int:
    """The timestamp the markers of a Prepare* transaction carry: version 1's
    decision timestamp; 0 for version 2 (the store stamps its own clock)."""
    invariant(md.state.is_prepare, lambda: f"markers for a {md.state.value} transaction")
    if md.transaction_version is TransactionVersion.V2:
        return 0
    invariant(md.decision_timestamp_ms >= 0,
              lambda: f"transactional id {md.transactional_id!r}: a version-1 decision "
              "without a timestamp")
    return md.decision_timestamp_ms


def marker_target(md: TxnMetadata) -> tuple[int, int]:
    """The producer id and epoch the markers of a Prepare* transaction carry,
    as `_decide` named them."""
    invariant(md.state.is_prepare, lambda: f"markers for a {md.state.value} transaction")
    if md.marker_producer_id != NO_PRODUCER_ID:
        return md.marker_producer_id, md.marker_producer_epoch
    # A decision recorded before decisions named their markers: the bumped
    # epoch, or (the bump rotated the producer id) the previous id one above.
    if md.producer_id != md.previous_producer_id and md.previous_producer_id != NO_PRODUCER_ID \
            and md.producer_epoch == 0:
        return md.previous_producer_id, md.previous_producer_epoch + 1
    return md.producer_id, md.producer_epoch
