"""The clients of the simulation: the SDK's own sans-I/O logic.

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
them (`add_partitions_to_txn`, the SDK's one-round-trip way); now and then a
client bug writes to a partition it never added. 85% commit. A
two-phase-commit producer (KIP-939) mostly prepares instead of committing,
hands the prepared state to the outside coordinator (`Handoff`) and then
completes it itself or exits; a new instance initialized with
keep_prepared_txn completes it (now and then with a wrong state, which must
abort it), or completes an already completed state again. A `Copier` is the
read-process-write loop of send_offsets_to_transaction; on a share of the
seeds the copiers are members of their group (`membership`), driven by the
SDK's own `GroupMembership` as its consumer drives it. Every outcome is
written to the checker's ledger, and an OUT_OF_ORDER_SEQUENCE_NUMBER the
client cannot explain is reported there.

A transactional id may run transaction version 1, as Kafka's clients do
through the Kafka listener: EndTxn keeps the producer's epoch, its sequence
numbers go on from one transaction to the next (one sequencer per partition
for the epoch), it always adds its partitions (AddPartitionsToTxn,
AddOffsetsToTxn) before writing, and after a transaction broken by a failed
write it bumps its own epoch with KIP-360 (InitProducerId with its id and
epoch) once the abort is done, as librdkafka and Kafka's Java client do. Its
coordinator calls are never duplicated by the network (Kafka's TCP does not
duplicate requests; version 1 relies on it, see network.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from oncelog import errors
from oncelog._batching import ProducerBatch
from oncelog._membership import GroupMembership, HeartbeatAnswer, HeartbeatRequest, MemberState
from oncelog._sequencing import PartitionSequencer
from oncelog._transactions import Op, ProducerTxnState, TxnStateMachine, ends_producer
from oncelog.errors import ErrorCode, OncelogError
from oncelog.records import iter_records
from oncelog.types import TopicPartition
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import CONSUMER_OFFSETS_TOPIC, ClusterLayout
from services.coordinator.core.transactions import TransactionVersion
from services.coordinator.txn_runtime import TxnCoordinatorRuntime
from services.group_coordinator.core.offsets import FetchedOffset
from services.group_coordinator.runtime import GroupCoordinatorRuntime
from services.partition_store.api import FetchItem, ProduceItem
from services.partition_store.log.partition import Isolation
from tests.sim.real.checker import Ledger, TxnFacts, TxnKey, offsets_metadata, record_value
from tests.sim.real.loop import DeterministicLoop
from tests.sim.real.network import (
    Incarnation,
    Network,
    RpcTimeout,
    RpcUnavailable,
    SimLeaderDirectory,
    coordinator_name,
    group_coordinator_name,
    serving_store,
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
# A member copier's session timeout (the coordinator hands out a heartbeat
# interval of a third of it): shorter than a copier's stalls and than many
# pauses, so that members are removed and the group rebalances.
SESSION_TIMEOUT_MS = 6_000
# How long a member copier that stops waits for its leave to be answered.
LEAVE_WAIT_S = 5.0
# Added to a producer id to name a prepared state that never existed.
WRONG_PRODUCER_ID = 1 << 50


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
class Handoff:
    """The outside coordinator of two-phase-commit producers (KIP-939; Spark's
    driver): the prepared state each transactional id last handed over, and
    the last one whose completion was answered."""

    handed: dict[str, tuple[int, int]] = field(default_factory=dict)
    completed: dict[str, tuple[int, int]] = field(default_factory=dict)

    def pending(self, transactional_id: str) -> tuple[int, int] | None:
        state = self.handed.get(transactional_id)
        return state if state is not None and self.completed.get(transactional_id) != state \
            else None


@dataclass(slots=True)
class Counters:
    committed: int = 0
    aborted: int = 0
    fenced: int = 0
    # Member copiers: joins answered, and TxnOffsetCommits refused because
    # the member was removed or its epoch or partitions were stale.
    joins: int = 0
    member_refusals: int = 0


class TxnProducer:
    def __init__(self, *, me: Incarnation, net: Network, loop: DeterministicLoop,
                 rng: random.Random, layout: ClusterLayout, ledger: Ledger,
                 transactional_id: str, instance: int, topic: str, partitions: int,
                 counters: Counters, trace: Callable[[str], None],
                 after_add: Callable[[TxnProducer], Awaitable[None]] | None = None,
                 txn_open: Callable[[str, tuple[int, int]], bool] | None = None,
                 handoff: Handoff | None = None, keep_prepared: bool = False,
                 follow_leaders: bool = False,
                 leads: Callable[[int, str, int], bool] | None = None,
                 transaction_version: TransactionVersion = TransactionVersion.V2) -> None:
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
        # Whether the transaction log holds an open transaction of (producer
        # id, epoch) for the transactional id (the checker's view of it).
        self._txn_open = txn_open
        # Two-phase commit (KIP-939): this id's producers mostly prepare
        # instead of committing and hand the prepared state to `handoff`;
        # `keep_prepared`: this instance is the outside coordinator's, which
        # keeps a prepared transaction on init and completes it.
        self.handoff = handoff
        self.keep_prepared = keep_prepared
        # The instance handed its prepared state over and exited.
        self.handed_over = False
        # Where partitions' leaders are (the SDK's metadata cache): the
        # layout's placement, or on a replicated cluster the stores' Metadata.
        self._leaders = SimLeaderDirectory(net, me, layout, follow=follow_leaders)
        # Replicated: whether a store leads a partition now, by the metadata
        # store (a deposed leader that has not heard yet lacks what the new
        # one took, and may rightly refuse a batch as out of order); and the
        # store each batch in flight went to.
        self._leads = leads
        self._sent_to: dict[int, int] = {}
        self.sm = TxnStateMachine(transactional_id)
        self.version = transaction_version
        # Version 1: one sequencer per partition for the current epoch, whose
        # sequences go on across transactions; and the partitions that
        # acknowledged a batch in the transaction under way.
        self._sequencers: dict[int, PartitionSequencer] = {}
        self._acked_in_txn: set[int] = set()
        self.producer_id = -1
        self.producer_epoch = -1
        self.txn_number = 0
        # How many attempts the last coordinator call that failed took.
        self.last_call_attempts = 0
        self.stop_requested = False
        self.done = False

    def __repr__(self) -> str:
        return f"producer {self.transactional_id}#{self.instance}"

    @property
    def v1(self) -> bool:
        return self.version is TransactionVersion.V1

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
                    lambda t: op(t.runtime), timeout_s=REQUEST_TIMEOUT_S, once=self.v1)
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
        tp = (batch.topic, batch.partition)
        try:
            leader, epoch = await self._leaders.leader_and_epoch(*tp)
        except ServiceError as exc:
            raise as_client_error(exc) from None
        # The leader epoch the client knows goes with the request, as the
        # SDK sends it (a store at another epoch refuses it).
        item = ProduceItem(batch.topic, batch.partition, data, leader_epoch=epoch)

        async def op(target: Incarnation) -> int:
            store = serving_store(target)
            (outcome,) = await store.produce(
                [item], timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
                transactional_id=self.transactional_id, add_partitions_to_txn=add)
            if outcome.error is not None:
                raise outcome.error
            return outcome.base_offset

        what = (f"produce {batch.topic}-{batch.partition} pid={batch.producer_id} "
                f"epoch={batch.producer_epoch} seq={batch.base_sequence}")
        self._sent_to[id(batch)] = leader
        try:
            return await self._net.call(self.me, store_name(leader), what, op,
                                        timeout_s=REQUEST_TIMEOUT_S)
        except (ServiceError, RpcTimeout, RpcUnavailable) as exc:
            error = as_client_error(exc)
            self._leaders.forget_on(*tp, error.code)
            raise error from None

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
        self.sm.transition_to(ProducerTxnState.FATAL_ERROR, error)
        self._counters.fenced += 1
        self._trace(f"{self} is done: {error}")
        return ProducerDone(str(error))

    async def init(self) -> None:
        self.sm.check(Op.INIT_TRANSACTIONS)
        self.sm.transition_to(ProducerTxnState.INITIALIZING)
        two_phase = self.handoff is not None
        try:
            producer_id, epoch, kept = await self._call_coordinator(
                f"init {self.transactional_id}"
                + (" two-phase" if two_phase else "")
                + (" keep-prepared" if self.keep_prepared else "")
                + (" v1" if self.v1 else ""),
                lambda c: c.init_producer_id(self.transactional_id, TXN_TIMEOUT_MS,
                                             two_phase_commit=two_phase,
                                             keep_prepared_txn=self.keep_prepared,
                                             transaction_version=self.version))
        except OncelogError as exc:
            raise self._fatal(exc) from None
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._trace(f"{self} has pid={producer_id} epoch={epoch}"
                    + (f", keeps prepared {kept}" if kept else ""))
        if kept is not None:
            self.sm.transition_to(ProducerTxnState.PREPARED_TRANSACTION)
            await self._complete_handed(kept=True)
            return
        self.sm.transition_to(ProducerTxnState.READY)
        if self.handoff is not None and self.handoff.pending(self.transactional_id) \
                and self.keep_prepared and (self.stop_requested or self._rng.random() < 0.5):
            # Nothing was kept: the outside coordinator completes the state
            # it holds anyway (a repeated completion, answered from the log).
            await self._complete_handed(kept=False)

    async def recover(self) -> None:
        """KIP-360 (version 1): after a transaction broken by a failed write
        was aborted, the producer bumps its own epoch with InitProducerId
        naming its id and epoch, so that a late copy of a batch of the aborted
        transaction cannot join the next one (which would share its epoch);
        its sequences restart at 0. Fenced: the producer ends. (Part of
        ending the aborted transaction: the SDK's state machine, which is
        version 2's, stays ready.)"""
        expected = (self.producer_id, self.producer_epoch)
        try:
            producer_id, epoch, _kept = await self._call_coordinator(
                f"recover {self.transactional_id} pid={expected[0]} epoch={expected[1]}",
                lambda c: c.init_producer_id(self.transactional_id, TXN_TIMEOUT_MS,
                                             transaction_version=self.version,
                                             expected=expected))
        except OncelogError as exc:
            raise self._fatal(exc) from None
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._sequencers.clear()
        self._trace(f"{self} recovered to pid={producer_id} epoch={epoch}")

    async def _complete_handed(self, *, kept: bool) -> None:
        """CompleteTransaction with the prepared state the outside coordinator
        holds (now and then a wrong one, which must abort a kept
        transaction); the answer says whether it committed."""
        assert self.handoff is not None  # noqa: S101 - a two-phase-commit producer
        handed = self.handoff.pending(self.transactional_id) or \
            self.handoff.handed.get(self.transactional_id)
        if handed is None:
            return
        # A wrong state names a producer id no coordinator hands out, so it
        # can never be the prepared state of a later transaction.
        state = handed if self._rng.random() >= 0.15 else (handed[0] + WRONG_PRODUCER_ID,
                                                            handed[1])
        await self.complete(state, handed, kept=kept)

    async def complete(self, state: tuple[int, int], handed: tuple[int, int], *,
                       kept: bool) -> None:
        """CompleteTransaction(state), retried until answered."""
        assert self.handoff is not None  # noqa: S101 - a two-phase-commit producer
        self.sm.transition_to(ProducerTxnState.COMPLETING)
        producer_id, epoch = self.producer_id, self.producer_epoch
        try:
            committed, new_id, new_epoch = await self._call_coordinator(
                f"complete {self.transactional_id} {state} pid={producer_id} epoch={epoch}",
                lambda c: c.complete_prepared(self.transactional_id, producer_id, epoch, state))
        except OncelogError as exc:
            if exc.code is ErrorCode.INVALID_TXN_STATE and not kept:
                # The coordinator knows no such prepared state: nothing changed.
                self.sm.transition_to(ProducerTxnState.READY)
                self.handoff.completed[self.transactional_id] = handed
                self._trace(f"{self}: {state} is not known")
                return
            raise self._fatal(exc) from None
        self._ledger.completions.append((self.transactional_id, state, committed))
        if committed:
            facts = next((f for f in self._ledger.txns.values() if f.producer == state
                          and f.key[0] == self.transactional_id), None)
            if facts is not None:
                facts.outcome = True
        self.handoff.completed[self.transactional_id] = handed
        self.producer_id, self.producer_epoch = new_id, new_epoch
        self.sm.transition_to(ProducerTxnState.READY)
        self._trace(f"{self} completed {state}: {'committed' if committed else 'not committed'}")

    async def prepare(self, facts: TxnFacts) -> None:
        """PrepareTransaction (after every batch was acknowledged): the
        prepared state goes to the outside coordinator; then this instance
        completes it itself, or exits (a task's way) and leaves it to a new
        instance."""
        assert self.handoff is not None  # noqa: S101 - a two-phase-commit producer
        self.sm.transition_to(ProducerTxnState.PREPARING)
        facts.commit_sent = True  # the client consents; the outside coordinator decides
        producer_id, epoch = self.producer_id, self.producer_epoch
        try:
            state = await self._call_coordinator(
                f"prepare {facts.key} pid={producer_id} epoch={epoch}",
                lambda c: c.prepare(self.transactional_id, producer_id, epoch))
        except OncelogError as exc:
            if ends_producer(exc):
                raise self._fatal(exc) from None
            self.sm.transition_to(ProducerTxnState.ABORTABLE_ERROR, exc)
            await self.end(facts, commit=False)
            return
        self.sm.transition_to(ProducerTxnState.PREPARED_TRANSACTION)
        self.handoff.handed[self.transactional_id] = state
        self._trace(f"{self} prepared {facts.key} as {state}")
        if self._rng.random() < 0.5:
            self.handed_over = True
            self._trace(f"{self} hands {state} over and exits")
            raise ProducerDone("handed over")
        await asyncio.sleep(self._rng.randint(0, 3_000) / 1000)
        await self.complete(state, state, kept=False)

    def begin(self) -> TxnFacts:
        """beginTransaction: the ledger's facts for the new transaction."""
        self.sm.check(Op.BEGIN_TRANSACTION)
        self.sm.transition_to(ProducerTxnState.IN_TRANSACTION)
        key: TxnKey = (self.transactional_id, self.instance, self.txn_number)
        self.txn_number += 1
        facts = self._ledger.begin(key, self._topic)
        facts.producer = (self.producer_id, self.producer_epoch)
        facts.version = int(self.version)
        self._acked_in_txn.clear()
        return facts

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
        # Version 1 adds first, as Kafka's clients do: a write that adds its
        # partition arriving before the last transaction's marker would join
        # that transaction, which has the same epoch.
        explicit_add = self._rng.random() < 0.5 or self.v1
        failure: BaseException | None = None
        unadded: list[int] = []
        if explicit_add:
            failure = await self.add_partitions(facts, [(self._topic, p) for p in chosen])
            if failure is None and self._after_add is not None:
                await self._after_add(self)
            others = [p for p in range(self._partitions) if p not in chosen]
            if others and self._rng.random() < 0.03:
                # A client bug: a write to a partition it never added. The
                # store's verification must refuse it, or the transaction
                # would hang there (no marker would ever come).
                unadded = [self._rng.choice(others)]
                self._trace(f"{self} CLIENT BUG: writes {self._topic}-{unadded[0]} of "
                            f"{facts.key} without adding it")
        if failure is None:
            results = await asyncio.gather(*(
                self.write(facts, p, add=not explicit_add) for p in [*chosen, *unadded]))
            failure = next((r for r in results if r is not None), None)
        await self.finish(facts, failure, commit=self._rng.random() < 0.85)

    async def finish(self, facts: TxnFacts, failure: BaseException | None, *,
                     commit: bool) -> None:
        """Ends a transaction as the SDK does after its writes: a fatal error
        ends the producer, an abortable one aborts, else commit or abort."""
        if failure is not None:
            if ends_producer(failure):
                raise self._fatal(failure)
            self.sm.transition_to(ProducerTxnState.ABORTABLE_ERROR, failure)
            await self.end(facts, commit=False)
            if self.v1:
                await self.recover()
            return
        if commit and self.handoff is not None and self._rng.random() < 0.8:
            await self.prepare(facts)
            return
        await self.end(facts, commit=commit)

    async def write(self, facts: TxnFacts, partition: int, *, add: bool,
                    batches: int | None = None,
                    payloads: Sequence[bytes] | None = None) -> BaseException | None:
        """Sends 1-2 batches (or `batches`) of 1-3 records to a partition
        through the SDK's sequencer; the error that broke the transaction, or
        None once all are acknowledged. `add`: the store adds the partition
        to the transaction (else it asks the coordinator to verify it).
        `payloads` (a copier's output): one record each, appended to the
        record's value, in batches of 1-3."""
        sequencer = self._sequencers.get(partition) if self.v1 else None
        if sequencer is None or sequencer.window or \
                (sequencer.producer_id, sequencer.producer_epoch) != (self.producer_id,
                                                                      self.producer_epoch):
            sequencer = PartitionSequencer(
                idempotent=True, transactional=True, max_in_flight=5,
                retry_backoff_ms=RETRY_BACKOFF_MS, retry_backoff_max_ms=RETRY_BACKOFF_MAX_MS,
                rng=self._rng)
            if self.v1:
                self._sequencers[partition] = sequencer
        now_ms = self._loop.now_ms()
        values = facts.values.setdefault(partition, [])
        todo = list(payloads) if payloads is not None else None
        count = batches if batches is not None else self._rng.randint(1, 2)
        while (count > 0) if todo is None else bool(todo):
            count -= 1
            batch = ProducerBatch(self._topic, partition, created_ms=now_ms,
                                  deadline_ms=now_ms + DELIVERY_TIMEOUT_MS,
                                  limit_bytes=1 << 20)
            for _ in range(self._rng.randint(1, 3)):
                value = record_value(facts.key, partition, len(values))
                if todo is not None:
                    if not todo:
                        break
                    value += b"|" + todo.pop(0)
                values.append(value)
                batch.add(None, value, None, now_ms)
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
            producer = (batch.producer_id, batch.producer_epoch)
            sent_to = self._sent_to.pop(id(batch), None)
            # Version 1's sequences span transactions: the store may have
            # forgotten the idle producer before this transaction's first
            # batch here (expiry); not once a batch of it was acknowledged.
            if exc.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and batch.sent_as_oldest \
                    and (not self.v1 or batch.partition in self._acked_in_txn) \
                    and self._txn_open is not None \
                    and self._txn_open(self.transactional_id, producer) \
                    and (self._leads is None or sent_to is None
                         or self._leads(sent_to, batch.topic, batch.partition)):
                # Every earlier batch of the partition was acknowledged (so
                # durable) before this attempt left, and the log says the
                # transaction is still open, so the store may not have
                # forgotten the producer: it lost deduplication state.
                self._ledger.violations.append(
                    f"{self}: {batch.topic}-{batch.partition} seq={batch.base_sequence} of "
                    f"producer {producer} refused as OUT_OF_ORDER_SEQUENCE_NUMBER ({exc}), "
                    "although every earlier batch was acknowledged and the transaction is "
                    "open in the log (lost deduplication state?)")
            return sequencer.on_error(batch, exc, self._loop.now_ms(), dispatched=True)
        self._sent_to.pop(id(batch), None)
        sequencer.on_success(batch)
        self._acked_in_txn.add(batch.partition)
        return None

    async def end(self, facts: TxnFacts, *, commit: bool) -> None:
        """EndTxn, retried with the same producer id and epoch until answered."""
        self.sm.transition_to(ProducerTxnState.COMMITTING if commit else ProducerTxnState.ABORTING)
        if commit:
            facts.commit_sent = True
        producer_id, epoch = self.producer_id, self.producer_epoch
        try:
            new_id, new_epoch = await self._call_coordinator(
                f"end-txn {'commit' if commit else 'abort'} {facts.key} pid={producer_id} "
                f"epoch={epoch}",
                lambda c: c.end_txn(self.transactional_id, producer_id, epoch, commit))
        except OncelogError as exc:
            if self.v1 and not commit and exc.code is ErrorCode.INVALID_TXN_STATE:
                # Version 1: nothing of this transaction is open (no add of it
                # landed); there is nothing to abort.
                facts.outcome = False
                self.sm.transition_to(ProducerTxnState.READY)
                self._trace(f"{self}: nothing of {facts.key} to abort")
                return
            if commit and self.last_call_attempts == 1:
                # Refused on its only attempt (copies of one request are
                # answered alike): this EndTxn committed nothing.
                facts.commit_refused = exc.code.name
            if commit and not ends_producer(exc):
                # A commit refused for good (e.g. the transaction timed out and
                # was aborted): the SDK's state is abortable; abort it.
                self.sm.transition_to(ProducerTxnState.ABORTABLE_ERROR, exc)
                await self.end(facts, commit=False)
                return
            raise self._fatal(exc) from None
        facts.outcome = commit
        facts.end_answer = (commit, new_id, new_epoch)
        self.producer_id, self.producer_epoch = new_id, new_epoch
        self.sm.transition_to(ProducerTxnState.READY)
        if commit:
            self._counters.committed += 1
        else:
            self._counters.aborted += 1
        self._trace(f"{self} {'committed' if commit else 'aborted'} {facts.key}")


class Copier(TxnProducer):
    """A read-process-write application (the SDK's consume-transform-produce
    loop, as examples/copier.py): it reads its input partitions under
    read_committed through the store's fetch, writes each input record's
    output to the output topic in a transaction, and commits the input
    offsets in the same transaction (AddOffsetsToTxn to the transaction
    coordinator, then TxnOffsetCommit to the group coordinator, as
    Producer.send_offsets_to_transaction does; the group is used outside
    the group protocol: generation -1, no member id). It starts from the
    group's committed offsets (OffsetFetch with require_stable), and goes
    back to them after every transaction that did not commit.

    With `membership` the copier is a member of the group instead (KIP-848,
    through the SDK's `GroupMembership`, as its consumer): a heartbeat task
    joins, heartbeats and leaves; the copy loop, between transactions,
    applies what the membership says (drops lost and revoked partitions,
    reads the committed offsets of assigned ones: the consumer's poll), and
    copies the partitions it owns. Each transaction's TxnOffsetCommit names
    the member id and epoch under which its input was read (KIP-447), so a
    copier that was removed (a stall past its session) or whose partitions
    moved is refused, aborts, and reads the committed offsets again once it
    has rejoined. `input_copied` (the harness's reading of the group's
    durable offsets) says when all the input is copied: a member copier
    that was told to stop then leaves the group and ends."""

    def __init__(self, *, group_id: str, input_topic: str, input_partitions: Sequence[int],
                 output_partitions: int, membership: bool = False,
                 input_copied: Callable[[], bool] | None = None, **kwargs: Any) -> None:
        super().__init__(partitions=output_partitions, **kwargs)
        self.group_id = group_id
        self._input_topic = input_topic
        self._fixed_inputs = list(input_partitions)
        self.positions: dict[int, int] = {}
        # Input partition -> where its input ends (what the copier has seen).
        self.input_ends: dict[int, int] = {}
        self._joins = 0
        self.membership = GroupMembership(
            group_id, session_timeout_ms=SESSION_TIMEOUT_MS,
            new_member_id=self._next_member_id) if membership else None
        self._input_copied = input_copied
        # Set when the copy loop changed what the heartbeat reports.
        self._wake_heartbeat = asyncio.Event()

    def __repr__(self) -> str:
        return f"copier {self.transactional_id}#{self.instance}"

    def _next_member_id(self) -> str:
        """A join's member id: unique, and the seed's (no random UUID)."""
        self._joins += 1
        return f"{self.transactional_id}.{self.instance}.{self._joins}"

    @property
    def _inputs(self) -> list[int]:
        """The input partitions this copier copies now: its fixed share, or
        the ones its membership owns (whose committed offsets it has read)."""
        if self.membership is None:
            return self._fixed_inputs
        return sorted(tp.partition for tp in self.membership.owned
                      if tp.partition in self.positions)

    @property
    def group_coordinator_node(self) -> str:
        layout = self._layout
        return group_coordinator_name(layout.group_coordinator_for_partition(
            layout.consumer_offsets_partition(self.group_id)))

    async def _call_group(self, what: str,
                          op: Callable[[GroupCoordinatorRuntime], Awaitable[T]]) -> T:
        """A group coordinator call, retried while retriable (the SDK's)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._net.call(
                    self.me, self.group_coordinator_node, what,
                    lambda t: op(_group_runtime(t)), timeout_s=REQUEST_TIMEOUT_S,
                    once=self.v1)
            except (ServiceError, RpcTimeout, RpcUnavailable) as exc:
                error = as_client_error(exc)
            if not error.retriable:
                raise error
            await asyncio.sleep(min(RETRY_BACKOFF_MAX_MS, RETRY_BACKOFF_MS * attempt) / 1000)

    async def run(self, max_txns: int) -> None:
        heartbeats = None
        try:
            await self.init()
            if self.membership is not None:
                self.membership.subscribe((self._input_topic,), self._loop.now_ms())
                heartbeats = asyncio.ensure_future(self._heartbeats())
            else:
                await self.fetch_positions()
            while self.txn_number < max_txns:
                await self._poll_membership()
                if not await self.copy_once():
                    if self.stop_requested and self.drained():
                        return
                    await asyncio.sleep(self._rng.randint(50, 500) / 1000)
                elif self.stop_requested and self.drained():
                    return
                await asyncio.sleep(self._rng.randint(0, 200) / 1000)
        except ProducerDone:
            pass
        finally:
            if heartbeats is not None:
                await self._leave(heartbeats)
            self.done = True

    def drained(self) -> bool:
        if self.membership is not None:
            return self._input_copied is not None and self._input_copied()
        return all(p in self.input_ends and self.positions.get(p, 0) >= self.input_ends[p]
                   for p in self._inputs)

    # ------------------------------------------------------------ membership

    async def _heartbeats(self) -> None:
        """The SDK consumer's heartbeat thread, as a task of this instance:
        sends what the membership asks for and feeds back the answers."""
        membership = self.membership
        assert membership is not None  # noqa: S101 - started only with one
        failures = 0
        while True:
            now_ms = self._loop.now_ms()
            before = membership.state
            membership.check_session(now_ms)
            if membership.state is not before:
                self._trace(f"{self} {membership.state.value}: {membership.error}")
            request = membership.next_request(now_ms)
            if request is None:
                if membership.state is MemberState.UNSUBSCRIBED:
                    return
                wait_ms = membership.wait_ms(now_ms)
                self._wake_heartbeat.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake_heartbeat.wait(), None if wait_ms is None
                                           else max(wait_ms, 1) / 1000)
                continue
            try:
                answer = await self._heartbeat(request)
            except OncelogError as exc:
                failures += 1
                membership.on_error(request, exc, self._loop.now_ms(), retry_after_ms=min(
                    RETRY_BACKOFF_MAX_MS, RETRY_BACKOFF_MS * failures))
                if not exc.retriable:
                    self._trace(f"{self} {request.kind.value} refused ({exc.code.name}): "
                                f"{membership.state.value}")
                continue
            failures = 0
            state, epoch = membership.state, membership.member_epoch
            membership.on_response(request, answer, now_ms, self._loop.now_ms())
            if state is MemberState.JOINING and membership.state is not state:
                self._counters.joins += 1
            if (membership.state, membership.member_epoch) != (state, epoch):
                self._trace(f"{self} {membership.state.value} member {membership.member_id} "
                            f"epoch {membership.member_epoch} assigned "
                            f"{sorted(tp.partition for tp in membership.target or ())}")

    async def _heartbeat(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        """One ConsumerGroupHeartbeat (the state machine decides retries)."""
        owned = [(tp.topic, tp.partition) for tp in request.owned_partitions]

        async def op(rt: GroupCoordinatorRuntime) -> HeartbeatAnswer:
            answer = await rt.heartbeat(
                group_id=self.group_id, member_id=request.member_id,
                member_epoch=request.member_epoch, instance_id="",
                topics=request.subscribed_topics, session_timeout_ms=request.session_timeout_ms,
                owned_partitions=owned)
            return HeartbeatAnswer(
                member_id=answer.member_id, member_epoch=answer.member_epoch,
                heartbeat_interval_ms=answer.heartbeat_interval_ms,
                assignment=frozenset(TopicPartition(t, p) for t, p in answer.assignment))

        try:
            return await self._net.call(
                self.me, self.group_coordinator_node,
                f"heartbeat {self.group_id} {request.kind.value} {request.member_id} "
                f"e{request.member_epoch} owns {sorted(p for _t, p in owned)}",
                lambda t: op(_group_runtime(t)),
                timeout_s=min(REQUEST_TIMEOUT_S, request.session_timeout_ms / 1000),
                once=self.v1)
        except (ServiceError, RpcTimeout, RpcUnavailable) as exc:
            raise as_client_error(exc) from None

    async def _poll_membership(self) -> None:
        """The consumer's poll, between transactions: applies the
        membership's plan (lost and revoked partitions dropped, assigned
        ones started at the group's committed offsets)."""
        membership = self.membership
        if membership is None:
            return
        plan = membership.plan()
        if plan is None:
            return
        for tp in plan.lost | plan.revoke:
            self.positions.pop(tp.partition, None)
        if plan.assign:
            await self.fetch_positions([tp.partition for tp in sorted(plan.assign)])
        membership.applied(plan, self._loop.now_ms())
        self._wake_heartbeat.set()
        self._trace(f"{self} applied: lost {sorted(tp.partition for tp in plan.lost)} revoked "
                    f"{sorted(tp.partition for tp in plan.revoke)} assigned "
                    f"{sorted(tp.partition for tp in plan.assign)}")
        if membership.state is MemberState.FATAL:
            # poll() raises it: the application ends this consumer.
            raise self._fatal(membership.error or RuntimeError("membership failed"))

    async def _leave(self, heartbeats: asyncio.Future[None]) -> None:
        """consumer.close(): the leave heartbeat, waited for a while (a
        member that is not heard from is removed at its session's end)."""
        membership = self.membership
        assert membership is not None  # noqa: S101 - started only with one
        membership.leave(self._loop.now_ms())
        self._wake_heartbeat.set()
        with contextlib.suppress(TimeoutError, OncelogError):
            await asyncio.wait_for(asyncio.shield(heartbeats), LEAVE_WAIT_S)
        heartbeats.cancel()
        membership.close()
        self._trace(f"{self} left the group")

    def _member(self) -> tuple[str, int] | None:
        """(member id, epoch) while the copier may read its partitions."""
        membership = self.membership
        if membership is None:
            return "", -1
        if membership.state not in (MemberState.STABLE, MemberState.RECONCILING) \
                or not membership.member_id:
            return None
        return membership.member_id, membership.member_epoch

    # ---------------------------------------------------------------- copying

    async def fetch_positions(self, partitions: Sequence[int] | None = None) -> None:
        """OffsetFetch(require_stable): the group's committed offsets, asked
        again while a transactional offset is pending (UNSTABLE_OFFSET_COMMIT)."""
        tps = [(self._input_topic, p) for p in (self._inputs if partitions is None
                                                  else partitions)]

        async def op(rt: GroupCoordinatorRuntime) -> list[FetchedOffset]:
            return rt.fetch_offsets(group_id=self.group_id, partitions=tps, require_stable=True)

        while True:
            try:
                fetched = await self._call_group(f"offset-fetch {self.group_id} {tps}", op)
            except OncelogError as exc:
                raise self._fatal(exc) from None
            if all(f.error is None for f in fetched):
                if partitions is None:
                    self.positions = {}
                self.positions.update({f.tp[1]: max(f.offset, 0) for f in fetched})
                self._trace(f"{self} starts at {self.positions}")
                return
            await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    async def _read_input(self, partition: int, offset: int) -> list[bytes] | None:
        """Input records from `offset` (read_committed), None if unreadable now."""
        tp = (self._input_topic, partition)
        try:
            leader, epoch = await self._leaders.leader_and_epoch(*tp)
        except ServiceError:
            return None
        item = FetchItem(self._input_topic, partition, offset, 1 << 16,
                         current_leader_epoch=epoch)

        async def op(target: Incarnation) -> tuple[list[bytes], int]:
            store = serving_store(target)
            (outcome,) = await store.fetch([item], isolation=Isolation.READ_COMMITTED)
            if outcome.error is not None:
                raise outcome.error
            return ([r.value or b"" for b in outcome.batches
                     for r in iter_records(b, min_offset=offset)], outcome.high_watermark)

        try:
            values, end = await self._net.call(
                self.me, store_name(leader), f"fetch {self._input_topic}-{partition}@{offset}",
                op, timeout_s=REQUEST_TIMEOUT_S)
        except ServiceError as exc:
            self._leaders.forget_on(*tp, exc.code)
            return None
        except (RpcTimeout, RpcUnavailable) as exc:
            self._leaders.forget_on(*tp, transport_error(exc))
            return None
        self.input_ends[partition] = end
        return values

    async def copy_once(self, *, commit: bool | None = None) -> bool:
        """One transaction over a chunk of input; False if there was none.
        It commits (`commit`, or 85% of the time), else aborts."""
        member = self._member()
        if member is None:
            return False  # not a member now: nothing is this copier's to copy
        chunks: dict[int, list[bytes]] = {}
        for p in self._inputs:
            got = await self._read_input(p, self.positions.get(p, 0))
            if got:
                chunks[p] = got[:self._rng.randint(1, 6)]
        if not chunks:
            return False
        facts = self.begin()
        facts.inputs = {p: (self.positions[p], self.positions[p] + len(v))
                        for p, v in chunks.items()}
        by_output: dict[int, list[bytes]] = {}
        for p, values in sorted(chunks.items()):
            by_output.setdefault(p % self._partitions, []).extend(values)
        explicit_add = self._rng.random() < 0.5 or self.v1
        failure: BaseException | None = None
        if explicit_add:
            failure = await self.add_partitions(
                facts, [(self._topic, p) for p in sorted(by_output)])
        if failure is None:
            results = await asyncio.gather(*(
                self.write(facts, p, add=not explicit_add, payloads=v)
                for p, v in sorted(by_output.items())))
            failure = next((r for r in results if r is not None), None)
        if failure is None:
            failure = await self.send_offsets(facts, {p: end for p, (_s, end)
                                                      in facts.inputs.items()}, member=member)
        await self.finish(facts, failure,
                          commit=self._rng.random() < 0.85 if commit is None else commit)
        if facts.outcome is True:
            self.positions.update({p: end for p, (_s, end) in facts.inputs.items()})
        else:
            await self.fetch_positions()
        return True

    async def send_offsets(self, facts: TxnFacts, offsets: dict[int, int], *,
                           member: tuple[str, int] = ("", -1)) -> OncelogError | None:
        """send_offsets_to_transaction: TxnOffsetCommit, whose write adds
        the group's __consumer_offsets partition to the transaction (as the
        SDK does); every other transaction first adds it with
        AddOffsetsToTxn (as a client of another language may), and version 1
        always does (Kafka's clients). The offsets' metadata names the
        transaction, for the checker. `member`: the member id and epoch
        under which the input was read ("", -1: outside the group protocol).
        The error that broke the transaction, if any."""
        # Alternating rather than drawn: a draw would move every later
        # choice of each seed.
        if facts.key[2] % 2 == 0 or self.v1:
            partition = self._layout.consumer_offsets_partition(self.group_id)
            failure = await self.add_partitions(facts, [(CONSUMER_OFFSETS_TOPIC, partition)])
            if failure is not None:
                return failure
        parts = [((self._input_topic, p), offset, offsets_metadata(facts.key))
                 for p, offset in sorted(offsets.items())]
        producer_id, epoch = self.producer_id, self.producer_epoch
        facts.offsets_sent = True

        async def op(rt: GroupCoordinatorRuntime) -> None:
            await rt.txn_commit_offsets(
                transactional_id=self.transactional_id, group_id=self.group_id,
                producer_id=producer_id, producer_epoch=epoch, member_id=member[0],
                generation_id=member[1], partitions=parts)

        try:
            as_member = f" member {member[0]} e{member[1]}" if member[0] else ""
            await self._call_group(f"txn-offset-commit {facts.key} pid={producer_id} "
                                   f"epoch={epoch}{as_member} {offsets}", op)
        except OncelogError as exc:
            if exc.code in MEMBER_REFUSALS:
                self._counters.member_refusals += 1
            return exc
        return None


# TxnOffsetCommit's refusals of a member that is no longer one, or whose
# epoch or partitions are stale (KIP-447's fencing of zombie members).
MEMBER_REFUSALS = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH,
                             ErrorCode.STALE_MEMBER_EPOCH})


def _group_runtime(target: Incarnation) -> GroupCoordinatorRuntime:
    runtime = target.runtime
    if not isinstance(runtime, GroupCoordinatorRuntime):
        raise ServiceError(ErrorCode.NETWORK_EXCEPTION, f"{target} is still starting")
    return runtime


__all__ = ["Copier", "Counters", "Handoff", "ProducerDone", "TxnProducer"]
