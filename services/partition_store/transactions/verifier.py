"""The port through which the store verifies a producer's first transactional
write to a partition with the transaction coordinator (transaction version 2,
DESIGN.md §4), and an in-memory adapter for tests and simulation.

Why: without the check, a producer that writes to a partition it never added
to its transaction (a client bug, or a late retry after the transaction ended)
leaves a transaction open on a partition the coordinator will never send a
marker to: a hanging transaction that pins the LSO forever. The store asks
the coordinator (AddPartitionsToTxn with verify_only) before the write that
would open a transaction on the partition, and refuses it unless the
partition is in the producer's ongoing transaction.

A client that sets `ProduceRequest.add_partitions_to_txn` (the SDK does) sends
no AddPartitionsToTxn for data partitions: the same question then asks the
coordinator to *add* the partition (`add=True`), which it does only for the
producer's current id and epoch, so the guarantee is the same (the
coordinator knows every partition a transaction wrote to) and the client
saves a round trip per transaction.

The answer also carries the transaction's timeout: how long the
transaction may hold the partition's last stable offset before the store
asks its coordinators about it (core/hanging_txns.py).

The gRPC adapter is coordinator_link.GrpcTxnVerifier.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ..core.outcomes import Rejection

TopicPartitionKey = tuple[str, int]
# Per partition: None when verified, else why not (the coordinator's code).
Verdicts = Mapping[TopicPartitionKey, Rejection | None]


@dataclass(frozen=True, slots=True)
class VerifyAnswer:
    """The coordinator's verdict per partition, and the timeout of the
    producer's transaction (0: not told)."""

    verdicts: Verdicts
    transaction_timeout_ms: int = 0


class TxnVerifier(Protocol):
    async def verify(
        self, *, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey], add: bool = False,
    ) -> VerifyAnswer:
        """Asks the coordinator that owns transactional_id whether each
        partition is in the producer's ongoing transaction (`add`: adds it
        first, starting the transaction if none is open). Raises
        ServiceError (a retriable code such as COORDINATOR_NOT_AVAILABLE or
        NOT_COORDINATOR) when it cannot get an answer."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class VerifyCall:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartitionKey, ...]
    add: bool = False


@dataclass(slots=True)
class _Txn:
    producer_id: int
    producer_epoch: int
    partitions: set[TopicPartitionKey] = field(default_factory=set)
    ongoing: bool = True
    timeout_ms: int = 0


class InMemoryTxnVerifier:
    """A coordinator stand-in: tests say which transactions are ongoing
    (`begin`, `add_partitions`, `end`) and it answers as the coordinator's
    verify_only would; with `add` it adds the partitions for the current id
    and epoch as the coordinator does (opening a new transaction after `end`).
    `calls` records every question; `hold()` makes questions wait until
    `release()` (to test what happens meanwhile); `unavailable` makes it
    raise that retriable error instead."""

    def __init__(self) -> None:
        self._txns: dict[str, _Txn] = {}
        self.calls: list[VerifyCall] = []
        self.unavailable: ErrorCode | None = None
        self._released: asyncio.Event | None = None
        self.waiting = 0

    def begin(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey] = (), *, timeout_ms: int = 0,
    ) -> None:
        self._txns[transactional_id] = _Txn(producer_id, producer_epoch, set(partitions),
                                            timeout_ms=timeout_ms)

    def add_partitions(
        self, transactional_id: str, partitions: Sequence[TopicPartitionKey]
    ) -> None:
        self._txns[transactional_id].partitions.update(partitions)

    def end(self, transactional_id: str) -> None:
        """The transaction is decided (markers are on their way)."""
        self._txns[transactional_id].ongoing = False

    def hold(self) -> None:
        self._released = asyncio.Event()

    def release(self) -> None:
        if self._released is not None:
            self._released.set()
            self._released = None

    async def verify(
        self, *, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey], add: bool = False,
    ) -> VerifyAnswer:
        self.calls.append(
            VerifyCall(transactional_id, producer_id, producer_epoch, tuple(partitions), add)
        )
        released = self._released
        if released is not None:
            self.waiting += 1
            try:
                await released.wait()
            finally:
                self.waiting -= 1
        if self.unavailable is not None:
            raise ServiceError(self.unavailable, "the in-memory coordinator is unavailable")
        txn = self._txns.get(transactional_id)
        if (add and txn is not None and txn.producer_id == producer_id
                and txn.producer_epoch == producer_epoch):
            if not txn.ongoing:
                txn.partitions.clear()
                txn.ongoing = True
            txn.partitions.update(partitions)
        return VerifyAnswer(
            {tp: self._answer(transactional_id, producer_id, producer_epoch, tp)
             for tp in partitions},
            txn.timeout_ms if txn is not None else 0)

    async def close(self) -> None:
        """Nothing to release (the runtime closes its verifier on shutdown)."""

    def _answer(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        tp: TopicPartitionKey,
    ) -> Rejection | None:
        txn = self._txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return Rejection(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"transactional id {transactional_id!r} does not map to producer {producer_id}",
            )
        if producer_epoch < txn.producer_epoch:
            return Rejection(
                ErrorCode.PRODUCER_FENCED,
                f"epoch {producer_epoch} is below the current epoch {txn.producer_epoch}",
            )
        if producer_epoch != txn.producer_epoch:
            return Rejection(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"epoch {producer_epoch} is not the current epoch {txn.producer_epoch}",
            )
        if not txn.ongoing or tp not in txn.partitions:
            return Rejection(
                ErrorCode.INVALID_TXN_STATE,
                f"{tp[0]}-{tp[1]} is not in the ongoing transaction of {transactional_id!r}",
            )
        return None
