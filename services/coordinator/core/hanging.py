"""The coordinator's answer to a partition store that holds a transaction
open past its timeout (ResolveTransaction; docs/partition-store.md, "Hanging
transactions").

The store names the transaction as it knows it: the producer id and the
epoch its data was written with on the partition, and (for version 1, whose
transactions share an epoch) the timestamp of the last marker it wrote for
that producer at that epoch. A transactional id's metadata says one of:

* nothing about it (`None`): it is not this id's transaction, or no longer
  (the id has moved on to a later epoch or producer id, expired, or never
  had it). When every `__transaction_state` partition says nothing, no
  coordinator will ever end the transaction: the store aborts it itself;
* ONGOING / HELD_OPEN: it is the id's open transaction (HELD_OPEN: one that
  never times out, two-phase commit);
* ABORTING: it is open past its timeout; the runtime aborts it now by the
  timeout path, with the asking partition added to its markers;
* DECIDED_COMMIT / DECIDED_ABORT: it is the id's last decided transaction
  (Prepare* or Complete*); the runtime sends its marker to the asking
  partition (again: a lost marker, or a partition the coordinator never
  knew was written).

Version 2 gives every transaction its own epoch, so (producer id, data
epoch) names one transaction. Version 1 reuses an epoch: an Ongoing
transaction at the store's epoch is taken to be the store's (its marker ends
everything open at that epoch, as Kafka's does), and the last decision at
that epoch is the store's transaction unless its marker already landed on
the partition (the store's last marker there carries its timestamp): then
the open transaction came after that decision, and nobody knows it.

A decision recorded before records named their data's epoch
(`decided_producer_epoch`) is matched by the rule of its time (markers one
above the data, version 1's own at it); for a two-phase-commit id, whose kept
transactions may sit further below, the answer is HELD_OPEN: nobody can tell,
and only an operator should end it. Pure: the runtime confirms that memory
is the log's before it answers (a zombie's "nothing" must not pass).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ...common.kernel.invariants import invariant
from ...common.kernel.txn_fate import TxnFate
from .transactions import (
    NO_PRODUCER_ID,
    TransactionVersion,
    TxnMetadata,
    TxnState,
    is_timed_out,
    marker_target,
    plan_timeout_abort,
)

NO_TIMESTAMP_MS = -1
_COMMITS = (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
# When two ids claim the transaction (it cannot happen: producer ids are
# unique per transactional id), the answer that acts least: a commit is
# never lost to a store's abort, an open transaction stays open.
_PRECEDENCE = (TxnFate.DECIDED_COMMIT, TxnFate.HELD_OPEN, TxnFate.ONGOING,
               TxnFate.ABORTING, TxnFate.DECIDED_ABORT)


@dataclass(frozen=True, slots=True)
class StoreQuestion:
    """A transaction a partition store holds open: its producer id, the
    epoch of its data there, the partition, and the timestamp of the last
    marker the store wrote for that producer at that epoch (NO_TIMESTAMP_MS:
    none)."""

    producer_id: int
    producer_epoch: int
    topic_partition: tuple[str, int]
    last_marker_timestamp_ms: int = NO_TIMESTAMP_MS


@dataclass(frozen=True, slots=True)
class StoreAnswer:
    """One `__transaction_state` partition's answer: the fate and, when an
    id knows the transaction, which (for the logs)."""

    fate: TxnFate
    transactional_id: str = ""
    transaction_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class DecidedMarker:
    """The marker of a decided transaction, as its Prepare* record named it."""

    producer_id: int
    producer_epoch: int
    commit: bool
    transaction_version: TransactionVersion
    # Version 1: the decision's timestamp; 0 for version 2 (the store's clock).
    timestamp_ms: int


def decided_data(md: TxnMetadata) -> tuple[int, int] | None:
    """(producer id, epoch) of the data of the id's last decided transaction
    (Prepare*, Complete*); None when the record cannot say."""
    if md.marker_producer_id == NO_PRODUCER_ID:
        if not md.state.is_prepare:
            return None
        # A decision recorded before decisions named their markers.
        producer_id, marker_epoch = marker_target(md)
        return producer_id, marker_epoch - 1
    if md.decided_producer_epoch >= 0:
        return md.marker_producer_id, md.decided_producer_epoch
    if md.two_phase_commit:
        return None
    if md.transaction_version is TransactionVersion.V1 and md.bump_reason == "end_txn":
        return md.marker_producer_id, md.marker_producer_epoch
    return md.marker_producer_id, md.marker_producer_epoch - 1


def _names_producer(md: TxnMetadata, producer_id: int) -> bool:
    return producer_id in (md.producer_id, md.previous_producer_id, md.marker_producer_id,
                           md.prepared_producer_id)


def fate_of(md: TxnMetadata, question: StoreQuestion, now_ms: int) -> TxnFate | None:
    """What this transactional id's metadata says about the store's
    transaction (None: nothing; see the module docstring)."""
    if md.state is TxnState.DEAD:
        return None
    data = (question.producer_id, question.producer_epoch)
    if md.state is TxnState.ONGOING and (md.producer_id, md.producer_epoch) == data:
        if md.two_phase_commit:
            return TxnFate.HELD_OPEN
        return TxnFate.ABORTING if is_timed_out(md, now_ms) else TxnFate.ONGOING
    if md.state is TxnState.PREPARED and md.prepared_state == data:
        return TxnFate.HELD_OPEN
    if md.state is TxnState.PREPARE_EPOCH_FENCE and _names_producer(md, question.producer_id):
        # Never entered here (a fence is an abort with a bump); were it, its
        # abort would follow: wait for it.
        return TxnFate.ONGOING
    if not (md.state.is_prepare or md.state.is_complete):
        return None
    decided = decided_data(md)
    if decided is None:
        return TxnFate.HELD_OPEN if _names_producer(md, question.producer_id) else None
    if decided != data:
        return None
    if (md.transaction_version is TransactionVersion.V1
            and md.decision_timestamp_ms == question.last_marker_timestamp_ms):
        # This decision's marker is the store's last at that epoch: the open
        # transaction there started after it, and no decision covers it.
        return None
    return TxnFate.DECIDED_COMMIT if md.state in _COMMITS else TxnFate.DECIDED_ABORT


def answer(transactions: Iterable[TxnMetadata], question: StoreQuestion,
           now_ms: int) -> StoreAnswer:
    """One `__transaction_state` partition's answer, from every transactional
    id it holds (a scan: the question is rare, asked only about transactions
    open past their timeout, so no index by producer id is kept)."""
    found: dict[TxnFate, TxnMetadata] = {}
    for md in transactions:
        fate = fate_of(md, question, now_ms)
        if fate is not None:
            found.setdefault(fate, md)
    for fate in _PRECEDENCE:
        knows = found.get(fate)
        if knows is not None:
            return StoreAnswer(fate, knows.transactional_id, knows.transaction_timeout_ms)
    return StoreAnswer(TxnFate.UNKNOWN)


def plan_hanging_abort(md: TxnMetadata, question: StoreQuestion, *, now_ms: int,
                       fresh_producer_id: int | None) -> TxnMetadata | None:
    """The timeout path's abort of an open transaction a store reports past
    its timeout (fate ABORTING), with the store's partition among its
    markers' partitions: it holds data of the transaction, whether or not
    the coordinator knew (a write the coordinator did not verify). None
    when the transaction is not (or no longer) timed out."""
    if fate_of(md, question, now_ms) is not TxnFate.ABORTING:
        return None
    planned = plan_timeout_abort(md, now_ms=now_ms, fresh_producer_id=fresh_producer_id)
    if planned is None:
        return None
    return replace(planned, partitions=planned.partitions | {question.topic_partition})


def decided_marker(md: TxnMetadata) -> DecidedMarker:
    """The marker of the id's decided transaction (Prepare* or Complete*),
    to send again to a partition that still holds it open."""
    invariant(md.state.is_prepare or md.state.is_complete,
              lambda: f"transactional id {md.transactional_id!r}: no decided transaction "
              f"({md.state.value})")
    if md.marker_producer_id != NO_PRODUCER_ID:
        producer_id, producer_epoch = md.marker_producer_id, md.marker_producer_epoch
    else:
        producer_id, producer_epoch = marker_target(md)
    version_1 = md.transaction_version is TransactionVersion.V1
    return DecidedMarker(
        producer_id=producer_id, producer_epoch=producer_epoch, commit=md.state in _COMMITS,
        transaction_version=md.transaction_version,
        timestamp_ms=md.decision_timestamp_ms if version_1 else 0,
    )


__all__ = ["NO_TIMESTAMP_MS", "DecidedMarker", "StoreAnswer", "StoreQuestion", "answer",
           "decided_data", "decided_marker", "fate_of", "plan_hanging_abort"]
