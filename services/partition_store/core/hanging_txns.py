"""Hanging transactions: when a transaction has held a partition's last
stable offset too long, who ends it (docs/partition-store.md, "Hanging
transactions").

Detection. A transaction open on a partition is *overdue* once it has been
open (by the store's clock, from its first batch here) longer than its
timeout plus a margin (`--hanging-txn-margin-ms`). The store learns each
transaction's timeout from the coordinator's answer to the verification of
its first write here (or to the add on the producer's behalf); a
transaction whose timeout it did not learn (written before a restart or a
leader change, or without verification) is held to
`--max-transaction-timeout-ms`, which no coordinator lets a transaction
exceed. No coordinator aborts a transaction later than its timeout (plus
its timer's period and the markers' way), so nothing overdue is still
legitimately open, except a two-phase-commit one, which never times out.

Resolution. The store asks every transaction coordinator about the
transaction (ResolveTransaction); each answers, for every
`__transaction_state` partition it owns, with a `TxnFate`
(services/coordinator/core/hanging.py). `decide` turns the answers into
what happens:

| answers | resolution |
|---|---|
| some partition: DECIDED_COMMIT | COORDINATOR_COMMITS: its COMMIT marker comes |
| else some: ONGOING or HELD_OPEN | WAIT_OPEN: a coordinator holds it open |
| else some: ABORTING or DECIDED_ABORT | COORDINATOR_ABORTS: its ABORT marker comes |
| else every partition: UNKNOWN | STORE_ABORTS |
| else (a partition did not answer) | WAIT_FOR_ANSWERS |

The precedence never lets a store abort what a coordinator may commit:
a commit anywhere wins, an open transaction anywhere waits, and the store
acts alone only when *every* `__transaction_state` partition has answered,
from memory its coordinator confirmed to be its log's, that nobody knows the
transaction. Then no coordinator can ever end it: a coordinator learns of a
transaction only from its own log, which had no record of it when it
answered, and the only way to put one there is an InitProducerId — which
bumps an epoch to one of its own, starting a *new* transaction that the
store's abort fences (below) — or a write of that transaction's decision,
which needs the record first.

The store's own ABORT marker (`store_abort_marker`) goes through the
normal marker path: the marker rules (core/producer_state.py), the log,
replication, the aborted index, the LSO. It carries:

* the producer's epoch + 1: the transaction-version-2 rule (strictly above
  the data) and version 1's (at or above) both take it, and the bump fences
  a zombie of that producer here (a late batch of the transaction is
  PRODUCER_FENCED, instead of opening it again: KIP-890's late produce).
  A real coordinator's later transactions here carry a higher epoch anyway:
  their data is written at an epoch at or above the store's (lower ones are
  fenced), and their markers one above that (version 2) or at it (version 1);
* the coordinator epoch the store already holds for the producer (the
  highest of its markers here): the marker rule refuses markers below it,
  and leaving it unchanged fences no coordinator that was not fenced already;
* the timestamp 0: version 1 refuses a marker at the same epoch whose
  timestamp is not above the last marker's, and a real version-1 decision at
  the bumped epoch carries its coordinator's clock, which is above 0 (a
  store clock there could be above a coordinator's that lags it, and would
  refuse that coordinator's marker for ever).

A transaction whose decision no coordinator knows any more — its record
lost with a wiped or rolled-back `__transaction_state` (an unclean
election), after its markers reached only some partitions — is aborted on
the partitions that still hold it open: that decision was lost with the
acknowledged writes the unclean election or the wipe lost, and nothing is
left to recover it from (Kafka leaves it to an operator, whose tool can
only abort it too).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import MARKER_ABORT, MAX_PRODUCER_EPOCH

from ...common.kernel.invariants import invariant
from ...common.kernel.txn_fate import TxnFate
from .outcomes import Rejection
from .producer_state import NO_TIME_MS, TXN_VERSION_2, ProducerEntry, TxnMarker

# The control batch timestamp of a store's own ABORT marker (see above).
STORE_ABORT_TIMESTAMP_MS = 0


class Resolution(enum.Enum):
    """What becomes of an overdue transaction, given the coordinators' answers."""

    WAIT_FOR_ANSWERS = "wait_for_answers"
    """Some `__transaction_state` partition did not answer (its coordinator
    is down, loading, or could not confirm its ownership): ask again later."""

    WAIT_OPEN = "wait_open"
    """A coordinator holds the transaction open: not past its timeout by the
    coordinator's clock, or two-phase commit (never times out)."""

    COORDINATOR_ABORTS = "coordinator_aborts"
    """A coordinator has decided (or just decided) to abort it; its ABORT
    marker is on its way to the partition."""

    COORDINATOR_COMMITS = "coordinator_commits"
    """A coordinator has decided to commit it; its COMMIT marker is on its
    way to the partition."""

    STORE_ABORTS = "store_aborts"
    """No coordinator knows it: the store writes the ABORT marker itself."""


@dataclass(frozen=True, slots=True)
class OpenTxn:
    """A transaction open on a partition, as the hanging check sees it."""

    producer_id: int
    # The epoch of the transaction's data here (the producer's current one).
    producer_epoch: int
    first_offset: int
    # The store's clock when its first batch here was appended.
    start_time_ms: int
    # The timeout its coordinator told this store (None: not learned here).
    timeout_ms: int | None
    # The timestamp of the producer's last marker here when it has the
    # transaction's epoch (version 1 shares epochs; NO_TIME_MS: none).
    last_marker_timestamp_ms: int = NO_TIME_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class HangingPolicy:
    """When an open transaction is overdue, and how often to ask again."""

    max_transaction_timeout_ms: int
    margin_ms: int

    def __post_init__(self) -> None:
        invariant(self.max_transaction_timeout_ms >= 1 and self.margin_ms >= 0,
                  lambda: f"a hanging-transaction policy of {self!r}")

    def timeout_of(self, txn: OpenTxn) -> int:
        """The transaction's timeout, or the bound on every timeout."""
        return txn.timeout_ms if txn.timeout_ms is not None else self.max_transaction_timeout_ms

    def overdue_at_ms(self, txn: OpenTxn) -> int:
        """The store's clock at which the transaction becomes overdue."""
        return txn.start_time_ms + self.timeout_of(txn) + self.margin_ms

    @property
    def retry_ms(self) -> int:
        """How long after an answer that leaves the transaction open the
        store asks again (the margin, at least a second: the answer's
        marker or the coordinator's timer needs that long to land)."""
        return max(self.margin_ms, 1_000)


def open_transactions(entries: Iterable[ProducerEntry],
                      timeouts_ms: Mapping[int, int]) -> list[OpenTxn]:
    """Every open transaction among a partition's producer entries, oldest
    first, with the timeouts learned for them (by producer id)."""
    found = []
    for entry in entries:
        if not entry.has_open_txn:
            continue
        last = entry.last_marker
        found.append(OpenTxn(
            producer_id=entry.producer_id, producer_epoch=entry.producer_epoch,
            first_offset=entry.current_txn_first_offset,
            start_time_ms=entry.current_txn_start_time_ms,
            timeout_ms=timeouts_ms.get(entry.producer_id),
            last_marker_timestamp_ms=(
                last.timestamp_ms if last is not None
                and last.producer_epoch == entry.producer_epoch else NO_TIME_MS),
        ))
    return sorted(found, key=lambda txn: txn.first_offset)


def decide(answers: Mapping[int, TxnFate | None], *, partitions: int) -> Resolution:
    """The resolution from each `__transaction_state` partition's answer
    (None, or absent: no answer); `partitions` is their count. See the
    table in the module docstring."""
    fates = {answers.get(p) for p in range(partitions)}
    if TxnFate.DECIDED_COMMIT in fates:
        return Resolution.COORDINATOR_COMMITS
    if fates & {TxnFate.ONGOING, TxnFate.HELD_OPEN}:
        return Resolution.WAIT_OPEN
    if fates & {TxnFate.ABORTING, TxnFate.DECIDED_ABORT}:
        return Resolution.COORDINATOR_ABORTS
    if fates == {TxnFate.UNKNOWN}:
        return Resolution.STORE_ABORTS
    return Resolution.WAIT_FOR_ANSWERS


def store_abort_marker(entry: ProducerEntry, txn: OpenTxn) -> TxnMarker | Rejection:
    """The ABORT marker the store writes itself for `txn` (see the module
    docstring), checked against the producer's current entry: the
    transaction must still be the one open (the same first offset and
    epoch), and an epoch must be left above it."""
    who = (f"producer {entry.producer_id} (epoch {entry.producer_epoch}, transaction from "
           f"offset {txn.first_offset})")
    if (entry.current_txn_first_offset != txn.first_offset
            or entry.producer_epoch != txn.producer_epoch):
        return Rejection(
            ErrorCode.INVALID_TXN_STATE,
            f"{who}: no longer open (open now: from offset {entry.current_txn_first_offset}, "
            f"epoch {entry.producer_epoch})")
    if entry.producer_epoch >= MAX_PRODUCER_EPOCH:
        return Rejection(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"{who}: the epoch is the last one ({MAX_PRODUCER_EPOCH}); no marker can be "
            "written above it (abort it by hand with the admin tools)")
    return TxnMarker(
        producer_id=entry.producer_id, producer_epoch=entry.producer_epoch + 1,
        control_type=MARKER_ABORT, coordinator_epoch=entry.coordinator_epoch,
        transaction_version=TXN_VERSION_2, timestamp_ms=STORE_ABORT_TIMESTAMP_MS,
    )


__all__ = ["STORE_ABORT_TIMESTAMP_MS", "HangingPolicy", "OpenTxn", "Resolution", "decide",
           "open_transactions", "store_abort_marker"]
