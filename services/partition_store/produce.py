"""Produce on one store node: resolve each item's partition, then check and
append every batch synchronously on the event loop (per-partition order is
the call order), queue the writes, and answer once the group commit is
durable. A batch that would open a transaction on a partition first waits
for the transaction coordinator's verification (TxnVerifier; one question
per request for all such partitions); meanwhile that producer's later
batches on the partition wait behind its gate (log/partition.py), other
producers and partitions go on.

Owns the verification questions of the requests in flight and nothing
else: partitions come from the catalog (catalog.py), durability from the
writer (shared.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError
from ..common.kernel.invariants import InvariantViolation, invariant
from . import metrics
from .api import ProduceItem, ProduceOutcome
from .catalog import Catalog
from .core.outcomes import Rejection
from .core.producer_state import Duplicate
from .log.partition import Appended, PartitionRuntime, VerifyFirst, WaitForGate
from .shared import StoreShared, durable_callback
from .transactions.verifier import TopicPartitionKey, TxnVerifier, VerifyAnswer

log = logging.getLogger("oncelog.partition_store")


class Producing:
    """Appends produced batches (see the module docstring)."""

    def __init__(self, shared: StoreShared, catalog: Catalog, *,
                 txn_verifier: TxnVerifier | None) -> None:
        self._shared = shared
        self.config = shared.config
        self._writer = shared.writer
        self._clock_ms = shared.clock_ms
        self._catalog = catalog
        # None: transactional writes that need verification fail with
        # COORDINATOR_NOT_AVAILABLE (unless the test-only skip flag is set).
        self._txn_verifier = txn_verifier

    async def produce(
        self, items: Sequence[ProduceItem], *, timeout_ms: int = 0, transactional_id: str = "",
        add_partitions_to_txn: bool = False, coordinator_write: bool = False,
    ) -> list[ProduceOutcome]:
        """Appends one batch per item. Checks and offsets happen synchronously,
        in item order, except for batches that must wait for a transaction
        verification (or behind another batch's); the answer waits until every
        append is durable or timeout_ms (0: the default) passes.
        `add_partitions_to_txn`: the verification adds the partition to the
        producer's transaction (the client sent no AddPartitionsToTxn).
        `coordinator_write`: the coordinators' own writes, the only ones
        internal topics take."""
        await self._catalog.ensure_known({item.topic for item in items},
                                 [(item.topic, item.partition) for item in items])
        now_ms = self._clock_ms()
        skip_verification = self._skips_verification(add_partitions_to_txn)
        outcomes: list[ProduceOutcome | None] = []
        waits: dict[int, asyncio.Future[None]] = {}
        deferred: list[_Deferred] = []
        # (producer id, epoch) -> the partitions to ask the coordinator about:
        # one question per request, however many partitions it opens.
        questions: dict[tuple[int, int], list[TopicPartitionKey]] = {}
        for index, item in enumerate(items):
            try:
                self._shared.check_accepting()
                part = self._catalog.resolve_leader(item.topic, item.partition, item.leader_epoch)
                if not coordinator_write:
                    self._catalog.check_not_internal(item.topic)
                self._catalog.check_enough_replicas(part)
                result = part.append(
                    item.batch, expected_log_end_offset=item.expected_log_end_offset,
                    now_ms=now_ms, transactional_id=transactional_id,
                    txn_verified=skip_verification,
                )
            except ServiceError as exc:
                outcomes.append(ProduceOutcome(item.topic, item.partition, exc))
                continue
            if isinstance(result, VerifyFirst):
                gate = part.open_verification_gate(result.producer_id)
                questions.setdefault((result.producer_id, result.producer_epoch), []).append(
                    (item.topic, item.partition)
                )
                deferred.append(_Deferred(index, item, part, result, gate))
                outcomes.append(None)
            elif isinstance(result, WaitForGate):
                deferred.append(_Deferred(index, item, part, result, None))
                outcomes.append(None)
            else:
                outcomes.append(self._accepted(index, item, part, result, now_ms, waits))
        if deferred:
            asked = {
                key: asyncio.ensure_future(self._verify(
                    transactional_id, key[0], key[1], tps, add=add_partitions_to_txn))
                for key, tps in questions.items()
            }
            finished = await asyncio.gather(*(
                self._append_deferred(d, asked, transactional_id, waits,
                                      add=add_partitions_to_txn)
                for d in deferred
            ))
            for d, outcome in zip(deferred, finished, strict=True):
                outcomes[d.index] = outcome
        final = [o for o in outcomes if o is not None]
        invariant(len(final) == len(items), "a produce item without an outcome")
        for index, error in (await self._shared.await_durable(waits, timeout_ms)).items():
            item = items[index]
            if error.code is ErrorCode.REQUEST_TIMED_OUT:
                error = ServiceError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{item.topic}-{item.partition}: the append at offset "
                    f"{final[index].base_offset} {error.message}; retry (the retry is "
                    "deduplicated)",
                )
            final[index] = ProduceOutcome(item.topic, item.partition, error)
        return final

    def _accepted(
        self, index: int, item: ProduceItem, part: PartitionRuntime,
        result: Appended | Duplicate, now_ms: int, waits: dict[int, asyncio.Future[None]],
    ) -> ProduceOutcome:
        """Queues an accepted append's writes (or finds a duplicate's pending
        original) and builds its outcome."""
        if isinstance(result, Appended):
            future = self._writer.submit(
                result.group,
                on_durable=durable_callback(part, result.base_offset, result.next_offset),
            )
            waits[index] = part.track_pending(result.base_offset, result.next_offset, future)
            self._shared.maybe_snapshot(part, now_ms)
            return ProduceOutcome(
                item.topic, item.partition, None, result.base_offset, False,
                part.log.log_start_offset, now_ms,
            )
        pending = part.pending_future(result.base_offset)
        if pending is not None:
            waits[index] = pending
        return ProduceOutcome(
            item.topic, item.partition, None, result.base_offset, True,
            part.log.log_start_offset, -1,
        )

    async def _append_deferred(
        self, deferred: _Deferred, asked: Mapping[tuple[int, int], asyncio.Future[VerifyAnswer]],
        transactional_id: str, waits: dict[int, asyncio.Future[None]], *, add: bool,
    ) -> ProduceOutcome:
        """Finishes an append that had to wait: for its verification (then
        appends with txn_verified), or for another batch's gate (then checks
        again, which may in turn need a verification or another gate)."""
        item, part = deferred.item, deferred.part
        tp = (item.topic, item.partition)
        pending: VerifyFirst | WaitForGate = deferred.result
        gate = deferred.gate
        # The producer whose gate this item holds (when gate is not None).
        gate_producer_id = pending.producer_id if isinstance(pending, VerifyFirst) else -1
        question: asyncio.Future[VerifyAnswer] | None = (
            asked[(pending.producer_id, pending.producer_epoch)]
            if isinstance(pending, VerifyFirst) else None
        )
        try:
            while True:
                if isinstance(pending, WaitForGate):
                    await pending.gate
                    self._shared.check_accepting()
                    self._check_still_leading(part, item)
                    result = part.append(
                        item.batch, expected_log_end_offset=item.expected_log_end_offset,
                        now_ms=self._clock_ms(), transactional_id=transactional_id,
                        txn_verified=self._skips_verification(add),
                    )
                    if isinstance(result, WaitForGate):
                        pending = result
                        continue
                    if isinstance(result, VerifyFirst):
                        pending = result
                        gate = part.open_verification_gate(result.producer_id)
                        gate_producer_id = result.producer_id
                        question = asyncio.ensure_future(self._verify(
                            transactional_id, result.producer_id, result.producer_epoch, [tp],
                            add=add,
                        ))
                        continue
                    return self._accepted(
                        deferred.index, item, part, result, self._clock_ms(), waits
                    )
                if question is None:
                    raise InvariantViolation("a verification without its question")
                answer = await question
                verdict = answer.verdicts[tp]
                if verdict is not None:
                    raise ServiceError(
                        verdict.code,
                        f"producer {pending.producer_id} (epoch {pending.producer_epoch}) on "
                        f"{item.topic}-{item.partition}: the transaction coordinator of "
                        f"transactional id {transactional_id!r} did not confirm that this "
                        f"partition is in the producer's transaction: {verdict.code.name}: "
                        f"{verdict.message}",
                    )
                self._shared.check_accepting()
                self._check_still_leading(part, item)
                result = part.append(
                    item.batch, expected_log_end_offset=item.expected_log_end_offset,
                    now_ms=self._clock_ms(), transactional_id=transactional_id,
                    txn_verified=True, own_gate=gate,
                )
                if not isinstance(result, (Appended, Duplicate)):
                    raise InvariantViolation(
                        f"{item.topic}-{item.partition}: a verified append answered {result!r}"
                    )
                if answer.transaction_timeout_ms > 0:
                    # How long the transaction may hold the LSO here (the
                    # hanging check, below).
                    part.txn_timeouts_ms[pending.producer_id] = answer.transaction_timeout_ms
                return self._accepted(deferred.index, item, part, result, self._clock_ms(), waits)
        except ServiceError as exc:
            return ProduceOutcome(item.topic, item.partition, exc)
        finally:
            if gate is not None:
                part.close_verification_gate(gate_producer_id, gate)

    def _check_still_leading(self, part: PartitionRuntime, item: ProduceItem) -> None:
        """After an await, before an append: the partition is still this
        node's to append to (led here, at an epoch the sender may write to,
        by the same runtime: a truncation reopens it) with enough replicas in
        sync. A batch that waited for its verification, or behind another's
        gate, while leadership moved away would otherwise go into a
        follower's log: at offsets the leader fills with other batches, and
        acknowledged once the leader's HW passes them."""
        if self._catalog.resolve_leader(item.topic, item.partition, item.leader_epoch) is not part:
            raise self._catalog.not_leader(item.topic, item.partition)
        self._catalog.check_enough_replicas(part)

    def _skips_verification(self, add_partitions_to_txn: bool) -> bool:
        """The unsafe test switch skips the check only: a request that asks the
        store to add its partitions to the transaction still does."""
        return self.config.unsafe_skip_txn_verification and not add_partitions_to_txn

    async def _verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey], *, add: bool = False,
    ) -> VerifyAnswer:
        """The coordinator's verdict per partition (`add`: after adding the
        partitions to the transaction); a failure to ask becomes the same
        (retriable) verdict for every partition. Never raises."""
        try:
            if self._txn_verifier is None:
                raise ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"store node {self.config.node_id} has no transaction coordinator to "
                    "verify transactional writes with",
                )
            answer = await self._txn_verifier.verify(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, partitions=partitions, add=add,
            )
        except ServiceError as exc:
            log.info("verification of producer %d (epoch %d, transactional id %r) failed: %s",
                     producer_id, producer_epoch, transactional_id, exc)
            answer = VerifyAnswer({tp: Rejection(exc.code, exc.message) for tp in partitions})
        for tp in partitions:
            verdict = answer.verdicts.get(tp)
            metrics.TXN_VERIFICATIONS.labels(
                "NONE" if verdict is None else verdict.code.name
            ).inc()
        return answer


@dataclass(slots=True)
class _Deferred:
    """A produce item whose append waits (for verification or a gate)."""

    index: int
    item: ProduceItem
    part: PartitionRuntime
    result: VerifyFirst | WaitForGate
    # The gate this item holds (it opened it for its own verification).
    gate: asyncio.Future[None] | None

