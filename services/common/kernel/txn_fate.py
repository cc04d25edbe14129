"""What a transaction coordinator knows of a producer's transaction that a
partition store holds open: the vocabulary of ResolveTransaction, shared by
the coordinator that answers it (services/coordinator/core/hanging.py) and
the store that acts on the answer (services/partition_store/core/
hanging_txns.py). docs/partition-store.md, "Hanging transactions".

Pure (no grpc): both services' core modules import it. The numbers are the
proto enum's (`TransactionFate` in coordinator.proto, each name there with a
`FATE_` prefix); tests/unit/test_hanging_txns.py checks the parity.
"""

from __future__ import annotations

import enum


class TxnFate(enum.IntEnum):
    """One `__transaction_state` partition's answer about one transaction."""

    UNKNOWN = 1
    """No transactional id of the partition has this transaction open or
    decided: never known there, its record lost, or the id has moved on to
    a later producer id or epoch (a later transaction)."""

    ONGOING = 2
    """Open (Ongoing) and not past its timeout: the producer may still
    commit it. The store asks again once the timeout has passed."""

    HELD_OPEN = 3
    """Open and never timed out by its coordinator: a two-phase-commit
    transaction (Ongoing or Prepared), which an outside coordinator decides.
    Only a completion or the admin abort ends it."""

    ABORTING = 4
    """Open past its timeout: the coordinator has just decided to abort it
    (its timeout path: PrepareAbort with an epoch bump that fences the
    producer); the markers go out, to the asking partition too."""

    DECIDED_ABORT = 5
    """Decided abort (PrepareAbort, CompleteAbort): the coordinator sends
    (again) the ABORT marker to the asking partition."""

    DECIDED_COMMIT = 6
    """Decided commit (PrepareCommit, CompleteCommit): the coordinator sends
    (again) the COMMIT marker to the asking partition."""

    @property
    def decided(self) -> bool:
        """Whether the coordinator has decided the outcome (or just did)."""
        return self in (TxnFate.ABORTING, TxnFate.DECIDED_ABORT, TxnFate.DECIDED_COMMIT)


__all__ = ["TxnFate"]
