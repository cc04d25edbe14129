"""The transactional producers of the simulation: the SDK's own sans-I/O logic.

Goal: drive the runtimes as the Python SDK does, without copying its rules:
`TxnStateMachine` (sdk/oncelog/_transactions.py) decides which call is
allowed and where an outcome leads; `PartitionSequencer` and `ProducerBatch`
(sdk/oncelog/_sequencing.py, _batching.py) number batches, decide retries
with the same sequence and what a failure means; the record codec encodes.
What is left here is the SDK's I/O shell in a few lines: send what the
sequencer says, feed back the answers, retry coordinator calls on retriable
errors (a commit whose answer was lost is retried, never turned into an
abort).

Method: each instance of a transactional id is a node incarnation of its
own (so the simulation can stall it past its transaction timeout, or let it
live on as a zombie after a new instance took the id over). A transaction
writes 1-2 batches to each of 1-3 partitions; half the transactions register
their partitions with AddPartitionsToTxn first (the Kafka way: the store then
asks the coordinator to verify, verify_only), the others let the store add
them (`add_partitions_to_txn`, the SDK's one-round-trip way). 85% commit.
Every outcome is written to the checker's ledger.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from oncelog import errors
from oncelog._batching import ProducerBatch
from oncelog._sequencing import PartitionSequencer
from oncelog._transactions import Op, TxnState, TxnStateMachine, ends_producer
from oncelog.errors import ErrorCode, OncelogError
from services.common.cluster import ClusterLayout
from services.common.errors import ServiceError
from services.coordinator.txn_runtime import TxnCoordinatorRuntime
from services.partition_store.runtime import ProduceItem, StoreRuntime
from tests.sim.real.checker import Ledger, TxnFacts, TxnKey, record_value
from tests.sim.real.loop import DeterministicLoop
from tests.sim.real.network import (
    Incarnation,
    Network,
    RpcTimeout,
    RpcUnavailable,
    coordinator_name,
    store_name,
    transport_error,
)

T = TypeVar("T")

# The SDK's request deadline and the transaction timeout the producers ask for.
REQUEST_TIMEOUT_S = 30.0
TXN_TIMEOUT_MS = 20_000
DELIVERY_TIMEOUT_MS = 60_000
RETRY_BACKOFF_MS = 100
RETRY_BACKOFF_MAX_MS = 1_000


class ProducerDone(Exception):
    """The instance is fenced or failed for good (the workload may start another)."""


def as_client_error(exc: BaseException) -> OncelogError:
    """A server's ServiceError or a transport failure, as the SDK sees it."""
    if isinstance(exc, ServiceError):
        return errors.error_for(exc.code, exc.message)
    if isinstance(exc, (RpcTimeout, RpcUnavailable)):
        return errors.error_for(transport_error(exc), str(exc))
    raise exc


@dataclass(slots=True)
class Counters:
    committed: int = 0
    aborted: int = 0
    fenced: int = 0


class TxnProducer:
    def __init__(self, *, me: Incarnation, net: Network, loop: DeterministicLoop,
                 rng: random.Random, layout: ClusterLayout, ledger: Ledger,
                 transactional_id: str, instance: int, topic: str, partitions: int,
                 counters: Counters, trace: Callable[[str], None],
                 after_add: Callable[[TxnProducer], Awaitable[None]] | None = None) -> None:
        self.me = me
        self._net = net
        self._loop = loop
        self._rng = rng
        self._layout = layout
        self._ledger = ledger
        self.transactional_id = transactional_id
        self.instance = instance
        self._topic = topic
        self._partitions = partitions
        self._counters = counters
        self._trace = trace
        # A fault hook: runs after a successful AddPartitionsToTxn, before
        # the transaction's first write (a client stalling in between).
        self._after_add = after_add
        self.sm = TxnStateMachine(transactional_id)
        self.producer_id = -1
        self.producer_epoch = -1
        self.txn_number = 0
        # How many attempts the last coordinator call that failed took.
        self.last_call_attempts = 0
        self.stop_requested = False
        self.done = False

    def __repr__(self) -> str:
        return f"producer {self.transactional_id}#{self.instance}"

    # --------------------------------------------------------------- calls

    @property
    def coordinator_node(self) -> str:
        layout = self._layout
        return coordinator_name(layout.coordinator_for_partition(
            layout.transaction_state_partition(self.transactional_id)))

    async def _call_coordinator(
        self, what: str, op: Callable[[TxnCoordinatorRuntime], Awaitable[T]],
    ) -> T:
        """One coordinator call, retried while the answer is retriable (the
        SDK's call_coordinator); raises the first non-retriable error."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._net.call(
                    self.me, self.coordinator_node, what,
                    lambda t: op(t.runtime), timeout_s=REQUEST_TIMEOUT_S)
            except (ServiceError, RpcTimeout, RpcUnavailable) as exc:
                error = as_client_error(exc)
            if not error.retriable:
                self.last_call_attempts = attempt
                raise error
            await asyncio.sleep(min(RETRY_BACKOFF_MAX_MS, RETRY_BACKOFF_MS * attempt) / 1000)

    async def _produce(self, batch: ProducerBatch, *, add: bool) -> int:
        """One Produce of one batch; the base offset, or raises OncelogError."""
        data = batch.data
        assert data is not None  # noqa: S101 - encoded by assign()
        item = ProduceItem(batch.topic, batch.partition, data)

        async def op(target: Incarnation) -> int:
            store = target.runtime
            if not isinstance(store, StoreRuntime) or not store.started:
                raise ServiceError(ErrorCode.NETWORK_EXCEPTION, f"{target} is starting")
            (outcome,) = await store.produce(
                [item], timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
                transactional_id=self.transactional_id, add_partitions_to_txn=add)
            if outcome.error is not None:
                raise outcome.error
            return outcome.base_offset

        dst = store_name(self._layout.store_for(batch.topic, batch.partition))
        what = (f"produce {batch.topic}-{batch.partition} pid={batch.producer_id} "
                f"epoch={batch.producer_epoch} seq={batch.base_sequence}")
        try:
            return await self._net.call(self.me, dst, what, op, timeout_s=REQUEST_TIMEOUT_S)
        except (ServiceError, RpcTimeout, RpcUnavailable) as exc:
            raise as_client_error(exc) from None

    # ---------------------------------------------------------- lifecycle

    async def run(self, max_txns: int) -> None:
        try:
            await self.init()
            while not self.stop_requested and self.txn_number < max_txns:
                await self._one_txn()
                await asyncio.sleep(self._rng.randint(0, 200) / 1000)
        except ProducerDone:
            pass
        finally:
            self.done = True

    def _fatal(self, error: BaseException) -> ProducerDone:
        self.sm.transition_to(TxnState.FATAL_ERROR, error)
        self._counters.fenced += 1
        self._trace(f"{self} is done: {error}")
        return ProducerDone(str(error))

    async def init(self) -> None:
        self.sm.check(Op.INIT_TRANSACTIONS)
        self.sm.transition_to(TxnState.INITIALIZING)
        try:
            producer_id, epoch, _kept = await self._call_coordinator(
                f"init {self.transactional_id}",
                lambda c: c.init_producer_id(self.transactional_id, TXN_TIMEOUT_MS))
        except OncelogError as exc:
            raise self._fatal(exc) from None
        self.producer_id, self.producer_epoch = producer_id, epoch
        self.sm.transition_to(TxnState.READY)
        self._trace(f"{self} has pid={producer_id} epoch={epoch}")

    def begin(self) -> TxnFacts:
        """beginTransaction: the ledger's facts for the new transaction."""
        self.sm.check(Op.BEGIN_TRANSACTION)
        self.sm.transition_to(TxnState.IN_TRANSACTION)
        key: TxnKey = (self.transactional_id, self.instance, self.txn_number)
        self.txn_number += 1
        return self._ledger.begin(key)

    async def add_partitions(self, facts: TxnFacts,
                             partitions: Sequence[tuple[str, int]]) -> OncelogError | None:
        """AddPartitionsToTxn (the Kafka way; AddOffsetsToTxn is the same call
        for the group's __consumer_offsets partition); the error, if any."""
        try:
            await self._call_coordinator(
                f"add-partitions {facts.key} {sorted(partitions)}",
                lambda c: c.add_partitions(
                    self.transactional_id, self.producer_id, self.producer_epoch,
                    frozenset(partitions)))
        except OncelogError as exc:
            return exc
        return None

    async def _one_txn(self) -> None:
        facts = self.begin()
        chosen = sorted(self._rng.sample(range(self._partitions),
                                         self._rng.randint(1, min(3, self._partitions))))
        explicit_add = self._rng.random() < 0.5
        failure: BaseException | None = None
        if explicit_add:
            failure = await self.add_partitions(facts, [(self._topic, p) for p in chosen])
            if failure is None and self._after_add is not None:
                await self._after_add(self)
        if failure is None:
            results = await asyncio.gather(*(
                self.write(facts, p, add=not explicit_add) for p in chosen))
            failure = next((r for r in results if r is not None), None)
        await self.finish(facts, failure, commit=self._rng.random() < 0.85)

    async def finish(self, facts: TxnFacts, failure: BaseException | None, *,
                     commit: bool) -> None:
        """Ends a transaction as the SDK does after its writes: a fatal error
        ends the producer, an abortable one aborts, else commit or abort."""
        if failure is not None:
            if ends_producer(failure):
                raise self._fatal(failure)
            self.sm.transition_to(TxnState.ABORTABLE_ERROR, failure)
            await self.end(facts, commit=False)
            return
        await self.end(facts, commit=commit)

    async def write(self, facts: TxnFacts, partition: int, *, add: bool,
                    batches: int | None = None) -> BaseException | None:
        """Sends 1-2 batches (or `batches`) of 1-3 records to a partition
        through the SDK's sequencer; the error that broke the transaction, or
        None once all are acknowledged. `add`: the store adds the partition
        to the transaction (else it asks the coordinator to verify it)."""
        sequencer = PartitionSequencer(
            idempotent=True, transactional=True, max_in_flight=5,
            retry_backoff_ms=RETRY_BACKOFF_MS, retry_backoff_max_ms=RETRY_BACKOFF_MAX_MS,
            rng=self._rng)
        now_ms = self._loop.now_ms()
        values = facts.values.setdefault(partition, [])
        for _ in range(batches if batches is not None else self._rng.randint(1, 2)):
            batch = ProducerBatch(self._topic, partition, created_ms=now_ms,
                                  deadline_ms=now_ms + DELIVERY_TIMEOUT_MS,
                                  limit_bytes=1 << 20)
            records = batch.records
            assert records is not None  # noqa: S101 - a new batch holds its records
            for _ in range(self._rng.randint(1, 3)):
                value = record_value(facts.key, partition, len(values))
                values.append(value)
                records.append((None, value, None, now_ms))
                batch.record_count += 1
            sequencer.assign(batch, producer_id=self.producer_id,
                             producer_epoch=self.producer_epoch)
        in_flight: set[asyncio.Task[BaseException | None]] = set()
        failure: BaseException | None = None
        while sequencer.unacked and failure is None:
            for batch in sequencer.batches_to_send(self._loop.now_ms()):
                in_flight.add(asyncio.ensure_future(self._send(sequencer, batch, add=add)))
            if not in_flight:
                expired = sequencer.expire(self._loop.now_ms())
                if expired:
                    failure = expired[0][1]
                    break
                wait_ms = max(1, sequencer.retry_at_ms - self._loop.now_ms())
                await asyncio.sleep(wait_ms / 1000)
                continue
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                failure = failure or task.result()
        if in_flight:
            # The SDK waits for in-flight batches before it aborts.
            for result in await asyncio.gather(*in_flight):
                failure = failure or result
        return failure

    async def _send(self, sequencer: PartitionSequencer, batch: ProducerBatch, *,
                    add: bool) -> BaseException | None:
        try:
            await self._produce(batch, add=add)
        except OncelogError as exc:
            return sequencer.on_error(batch, exc, self._loop.now_ms(), dispatched=True)
        sequencer.on_success(batch)
        return None

    async def end(self, facts: TxnFacts, *, commit: bool) -> None:
        """EndTxn, retried with the same producer id and epoch until answered."""
        self.sm.transition_to(TxnState.COMMITTING if commit else TxnState.ABORTING)
        if commit:
            facts.commit_sent = True
        producer_id, epoch = self.producer_id, self.producer_epoch
        try:
            new_id, new_epoch = await self._call_coordinator(
                f"end-txn {'commit' if commit else 'abort'} {facts.key} pid={producer_id} "
                f"epoch={epoch}",
                lambda c: c.end_txn(self.transactional_id, producer_id, epoch, commit))
        except OncelogError as exc:
            if commit and self.last_call_attempts == 1:
                # Refused on its only attempt (copies of one request are
                # answered alike): this EndTxn committed nothing.
                facts.commit_refused = exc.code.name
            if commit and not ends_producer(exc):
                # A commit refused for good (e.g. the transaction timed out and
                # was aborted): the SDK's state is abortable; abort it.
                self.sm.transition_to(TxnState.ABORTABLE_ERROR, exc)
                await self.end(facts, commit=False)
                return
            raise self._fatal(exc) from None
        facts.outcome = commit
        self.producer_id, self.producer_epoch = new_id, new_epoch
        self.sm.transition_to(TxnState.READY)
        if commit:
            self._counters.committed += 1
        else:
            self._counters.aborted += 1
        self._trace(f"{self} {'committed' if commit else 'aborted'} {facts.key}")


__all__ = ["Counters", "ProducerDone", "TxnProducer"]
