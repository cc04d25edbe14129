"""The port through which a store asks the transaction coordinators about a
transaction it has held open past its timeout (ResolveTransaction;
core/hanging_txns.py says what it does with the answers), and an in-memory
adapter for tests.

The store does not know the transaction's transactional id (batches do not
carry it), so it asks every coordinator of the layout: each answers for the
`__transaction_state` partitions it owns. A partition whose coordinator
cannot be reached, or cannot answer now (loading, no longer its owner), is
left out of the answers; the store then waits and asks again.

The gRPC adapter is coordinator_link.GrpcTxnResolver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ...common.kernel.txn_fate import TxnFate


@dataclass(frozen=True, slots=True)
class HangingQuestion:
    """A transaction a store holds open: its producer, the epoch of its data,
    its partition, and the timestamp of the producer's last marker there at
    that epoch (-1: none; version-1 transactions share an epoch)."""

    producer_id: int
    producer_epoch: int
    topic: str
    partition: int
    last_marker_timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class CoordinatorAnswer:
    """One `__transaction_state` partition's answer."""

    fate: TxnFate
    # The transactional id that knows the transaction ("": none does).
    transactional_id: str = ""
    transaction_timeout_ms: int = 0


# By __transaction_state partition; a partition without an answer is absent.
Answers = Mapping[int, CoordinatorAnswer]


class TxnResolver(Protocol):
    async def resolve(self, question: HangingQuestion) -> Answers:
        """Asks every coordinator; never raises (a coordinator that does not
        answer leaves its partitions out)."""

    async def close(self) -> None: ...


@dataclass(slots=True)
class InMemoryTxnResolver:
    """A coordinators stand-in: `answers` is what every question gets (each
    `__transaction_state` partition's answer; missing: no answer) and
    `asked` records the questions."""

    answers: dict[int, CoordinatorAnswer] = field(default_factory=dict)
    asked: list[HangingQuestion] = field(default_factory=list)

    async def resolve(self, question: HangingQuestion) -> Answers:
        self.asked.append(question)
        return dict(self.answers)

    async def close(self) -> None:
        """Nothing to release."""


__all__ = ["Answers", "CoordinatorAnswer", "HangingQuestion", "InMemoryTxnResolver",
           "TxnResolver"]
