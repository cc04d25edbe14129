"""The transaction coordinator's runtime: owned `__transaction_state`
partitions, the two-phase commit, timers.

The machinery it shares with the group coordinator — owning partitions,
loading them by replay, claiming the coordinator epoch, fencing, conditional
append then replay, reload after an uncertain write, ownership confirmation —
is services/common/shards/runtime.py; this module is what only
transactions have.

For each request: the pure core plans a new TxnMetadata on the partition's
pending state (what is durable plus the changes submitted before it); the
runtime appends it to the partition's log with the other changes planned
while the previous append was in flight (group commit: one conditional append
per batch, on the log end offset this coordinator knows, so a coordinator
that lost ownership, or whose earlier write's outcome is unknown, cannot
write past what it has seen); only once its batch is durable is the record
replayed into memory and the reply sent. A change planned on a batch that
failed is planned again (`_replanned`). Any write whose outcome is
uncertain makes the runtime reload the partition from the log, which is the
only source of truth.

Taking over a partition appends a coordinator-epoch record; markers carry that
epoch and the partition stores refuse lower ones, so a zombie coordinator can
neither write the transaction log nor markers.

The answers given from memory without a write are the partition stores'
verification of a producer's first transactional write to a partition
(`verify_partitions`) and their question about a transaction they hold open
past its timeout (`resolve_transaction`). A zombie (paused, replaced, not
yet fenced because it has not tried to write) would answer them from a
stale view, so it first confirms that the log still ends where its memory
does (`_confirm_ownership`); docs/coordinator.md says why that is enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from oncelog.wire.errors import ErrorCode

from ..common.kernel.crashpoints import crash_point
from ..common.kernel.errors import ServiceError, check_id_length
from ..common.kernel.invariants import invariant
from ..common.kernel.txn_fate import TxnFate
from ..common.metadata.cluster import TRANSACTION_STATE_TOPIC, ClusterLayout
from ..common.shards.runtime import (
    CoordinatorRuntime,
    LogBatch,
    LogRead,
    OwnedPartition,
    PlanView,
    StalePlan,
)
from . import metrics
from .config import TxnConfig
from .core import hanging
from .core import transactions as txn
from .core.txn_log import (
    TXN_KEY_PREFIX,
    TxnPartitionState,
    encode_tombstone,
    encode_txn,
)
from .markers import MarkerSender, MarkerSpec
from .producer_id_manager import ProducerIdManager
from .storage.txn_log import Entry, TxnLog

log = logging.getLogger(__name__)

# What EndTxn and CompleteTransaction plan: a decision to persist, or None.
_DecisionPlan = TypeVar("_DecisionPlan", txn.EndPlan, txn.CompletePlan)
T = TypeVar("T")

# How often a request is planned again because what it was planned on did not
# become durable (a batch before it failed) before StalePlan, a retriable
# error, goes to the client.
MAX_REPLANS = 3

# Marker results after which a partition needs no more markers: it landed, or
# the partition is gone (a deleted topic gets no marker, as in Kafka).
_MARKER_DONE = {ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


@dataclass
class TxnPartition(OwnedPartition[TxnPartitionState]):
    """An owned `__transaction_state` partition, with the marker tasks of its
    decided transactions (not replayed: a load starts them again)."""

    marker_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # Per marker task: set once every marker of its transaction has landed,
    # before Complete* is persisted (see _change).
    markers_landed: dict[str, _Landing] = field(default_factory=dict)


@dataclass(slots=True)
class _Landing:
    """Which decided transaction a marker task writes markers for, and
    whether they have all landed."""

    decided: txn.TxnMetadata
    started_s: float
    landed: asyncio.Event = field(default_factory=asyncio.Event)
    # Requests for the id waiting for the markers: once they land, the
    # marker task leaves Complete* to them (their append carries it) and
    # persists it itself only if none did.
    waiters: int = 0
    handed: asyncio.Event = field(default_factory=asyncio.Event)

    def leave(self) -> None:
        self.waiters -= 1
        if self.waiters == 0:
            self.handed.set()


@dataclass(frozen=True, slots=True)
class _Write:
    """A submitted change: its answer (None once durable and replayed)."""

    done: asyncio.Future[None]


def _count_transitions(done: asyncio.Future[None],
                       transitions: Sequence[tuple[str, str]]) -> None:
    if not done.cancelled() and done.exception() is None:
        for previous, after in transitions:
            metrics.TXN_STATE_TRANSITIONS.labels(previous, after).inc()


class _TxnStateLog:
    """The shared runtime's log port over the TxnLog port: the transaction
    coordinator is the only writer of `__transaction_state`, and replays it
    record by record."""

    def __init__(self, txn_log: TxnLog) -> None:
        self._log = txn_log

    async def read(self, partition: int, from_offset: int, *,
                   max_wait_ms: int = 0) -> LogRead[Entry]:
        # Only loads read (this log has no other writer to follow), from the start.
        invariant(from_offset == 0 and max_wait_ms == 0,
                  lambda: f"__transaction_state-{partition} read from {from_offset}")
        entries, log_end = await self._log.read_all(partition)
        return LogRead([LogBatch(log_end, entries)], log_end, log_end)

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int, writer: None) -> LogBatch[Entry]:
        log_end = await self._log.append(partition, entries,
                                         expected_log_end_offset=expected_log_end_offset)
        return LogBatch(log_end, entries)

    async def log_end_offset(self, partition: int) -> int:
        return await self._log.log_end_offset(partition)


def _replay(state: TxnPartitionState, record: Entry) -> None:
    state.replay(*record)


def _copy_state(state: TxnPartitionState) -> TxnPartitionState:
    """A pending shard to replay submitted records into: the values
    (TxnMetadata) are immutable, so copying the map is enough."""
    return TxnPartitionState(coordinator_epoch=state.coordinator_epoch,
                             epoch_owner_node_id=state.epoch_owner_node_id,
                             transactions=dict(state.transactions))


class TxnCoordinatorRuntime:
    """The transaction coordinator: a shard of the shared coordinator runtime
    (services/common/shards/runtime.py) per owned `__transaction_state`
    partition, plus what only transactions have: producer ids, markers,
    timers."""

    def __init__(
        self,
        *,
        layout: ClusterLayout,
        node_id: int,
        txn_log: TxnLog,
        markers: MarkerSender,
        producer_ids: ProducerIdManager,
        now_ms: Callable[[], int],
        config: TxnConfig,
        follow_leaders: bool = False,
    ) -> None:
        """`follow_leaders`: this coordinator runs in a store's process and
        owns the partitions that store leads (its `follow`), not the
        layout's."""
        self._layout = layout
        self._node_id = node_id
        self._markers = markers
        self._producer_ids = producer_ids
        self._now_ms = now_ms
        self.config = config
        self._runtime: CoordinatorRuntime[TxnPartition, TxnPartitionState, Entry, None] = \
            CoordinatorRuntime(
                topic=TRANSACTION_STATE_TOPIC, node_id=node_id, kind="coordinator",
                partitions=(p for p in range(layout.transaction_state_partitions)
                            if follow_leaders or layout.coordinator_for_partition(p) == node_id),
                log=_TxnStateLog(txn_log),
                new_partition=lambda p: TxnPartition(p, TxnPartitionState()),
                new_shard=TxnPartitionState, replay=_replay,
                others_write=False, on_loaded=self._resume_markers,
                on_unloaded=self._stop_markers,
                copy_shard=_copy_state, replay_entry=_replay, on_batch=metrics.observe_batch,
                follow_leaders=follow_leaders,
            )
        self.partitions = self._runtime.partitions
        self.follow = self._runtime.follow

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Loads every owned partition in the background (the store may still
        be starting) and starts the timer."""
        metrics.MAX_TRANSACTION_TIMEOUT_SECONDS.set(self.config.max_transaction_timeout_ms / 1000)
        self.publish_gauges()
        self._runtime.start()
        self._runtime.spawn(self._timer_loop())

    async def stop(self) -> None:
        await self._runtime.stop(
            task for owned in self.partitions.values() for task in owned.marker_tasks.values()
        )

    def _resume_markers(self, owned: TxnPartition) -> None:
        """Prepare* transactions are decided: their markers go out again."""
        for md in owned.state.transactions.values():
            if md.state.is_prepare:
                self._start_markers(owned, md.transactional_id)

    @staticmethod
    def _stop_markers(owned: TxnPartition) -> None:
        """Memory may be behind the log: the reload resumes the markers."""
        for task in owned.marker_tasks.values():
            task.cancel()
        owned.marker_tasks.clear()

    # ------------------------------------------------------------- plumbing

    def owned_for(self, transactional_id: str) -> TxnPartition:
        # Every request for a transactional id comes here first. The id is
        # stored in __transaction_state's records and named in errors, which
        # must fit in a gRPC status (see limits.MAX_ID_LENGTH).
        check_id_length("transactional_id", transactional_id)
        return self._runtime.owned(self._layout.transaction_state_partition(transactional_id),
                                   f"transactional id {transactional_id!r}")

    def _submit(self, owned: TxnPartition, view: PlanView[TxnPartitionState],
                records: Sequence[Entry], *,
                completed: txn.TxnMetadata | None = None) -> _Write:
        """Submits records planned on `view` for the partition's next batch
        (the shared runtime's group commit); the caller holds owned.lock and
        then awaits `_written` without it. Each change is one record per
        transactional id, except that `completed` (a Complete* record) may
        come first, before the id's next state."""
        ids = [key[len(TXN_KEY_PREFIX):].decode() for key, _ in records
               if key is not None and key.startswith(TXN_KEY_PREFIX)]
        before = {tid: view.state.transactions.get(tid) for tid in ids}
        done = self._runtime.submit(owned, records, view)
        pending = self._runtime.view(owned).state
        transitions: list[tuple[str, str]] = []
        for tid in dict.fromkeys(ids):
            previous, after = before[tid], pending.transactions.get(tid)
            if completed is not None and completed.transactional_id == tid:
                transitions.append((previous.state.value if previous else "none",
                                    completed.state.value))
                previous = completed
            transitions.append((previous.state.value if previous else "none",
                                after.state.value if after else txn.TxnState.DEAD.value))
        # Counted when durable, whether or not the caller still waits.
        done.add_done_callback(lambda f: _count_transitions(f, transitions))
        return _Write(done)

    async def _written(self, owned: TxnPartition, view: PlanView[TxnPartitionState],
                       write: _Write) -> None:
        """Returns once the submitted change is durable and replayed; raises
        its batch's error (or StalePlan)."""
        await self._runtime.settle(owned, view, write.done)

    async def _replanned(self, request: Callable[[], Awaitable[T]]) -> T:
        """Runs a request again when what it was planned on did not become
        durable (StalePlan: a batch before its change failed and was rolled
        back); nothing of it was written, so planning it again on the state
        as it is now gives the answer a request arriving now would get."""
        for _attempt in range(MAX_REPLANS):
            try:
                return await request()
            except StalePlan as exc:
                log.debug("planning again: %s", exc.message)
        return await request()

    async def _wait_for_markers(self, owned: TxnPartition, transactional_id: str) -> None:
        """Holds a request that arrives while the previous transaction's markers
        are in flight until they have landed (bounded), instead of answering
        CONCURRENT_TRANSACTIONS at once: back-to-back transactions then pay no
        client retry round trip."""
        task = owned.marker_tasks.get(transactional_id)
        if task is None or task.done():
            return
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, ServiceError):
            await asyncio.wait_for(asyncio.shield(task), self.config.wait_for_markers_ms / 1000)

    async def _wait_for_landing(self, landing: _Landing, task: asyncio.Task[None]) -> None:
        """As _wait_for_markers, but only until the markers have landed: the
        Complete* record that follows can go in the caller's own append."""
        waits: list[asyncio.Future[object]] = [
            asyncio.ensure_future(asyncio.shield(task)),
            asyncio.ensure_future(landing.landed.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=self.config.wait_for_markers_ms / 1000,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _landed_completion(self, owned: TxnPartition,
                           md: txn.TxnMetadata | None) -> txn.TxnMetadata | None:
        """The Complete* state of `md` when it is a decided transaction
        whose markers have all landed and whose Complete* is not yet
        persisted; None otherwise."""
        if md is None or not md.state.is_prepare:
            return None
        landing = owned.markers_landed.get(md.transactional_id)
        if landing is None or not landing.landed.is_set() or landing.decided != md:
            return None
        return txn.plan_complete(md, now_ms=self._now_ms())

    async def _fresh_id_if_needed(self, md: txn.TxnMetadata | None, *,
                                  end_txn: bool = False) -> int | None:
        if txn.needs_fresh_producer_id(md, end_txn=end_txn):
            return await self._producer_ids.next_producer_id()
        return None

    # ------------------------------------------------------------- requests

    async def init_producer_id(
        self, transactional_id: str, transaction_timeout_ms: int, *, two_phase_commit: bool = False,
        keep_prepared_txn: bool = False,
        transaction_version: txn.TransactionVersion = txn.TransactionVersion.V2,
        expected: tuple[int, int] | None = None,
    ) -> tuple[int, int, tuple[int, int] | None]:
        """The producer id and epoch, and the prepared state of a transaction
        kept with keep_prepared_txn (None when none was kept). `expected`:
        KIP-360's producer id and epoch of the caller (None: a new instance)."""
        if two_phase_commit and not self.config.allow_two_phase_commit:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"transactional id {transactional_id!r}: this coordinator does not allow "
                "two-phase commit (--allow-two-phase-commit is off)",
            )
        owned = self.owned_for(transactional_id)
        await self._wait_for_markers(owned, transactional_id)
        return await self._replanned(lambda: self._init_producer_id(
            owned, transactional_id, transaction_timeout_ms, two_phase_commit=two_phase_commit,
            keep_prepared_txn=keep_prepared_txn, transaction_version=transaction_version,
            expected=expected))

    async def _init_producer_id(
        self, owned: TxnPartition, transactional_id: str, transaction_timeout_ms: int, *,
        two_phase_commit: bool, keep_prepared_txn: bool,
        transaction_version: txn.TransactionVersion, expected: tuple[int, int] | None,
    ) -> tuple[int, int, tuple[int, int] | None]:
        async with owned.lock:
            self._runtime.check_loaded(owned)
            view = self._runtime.view(owned)
            md = view.state.transactions.get(transactional_id)
            fresh_producer_id = await self._fresh_id_if_needed(md)
            try:
                plan = txn.plan_init_producer_id(
                    md, transactional_id=transactional_id,
                    transaction_timeout_ms=transaction_timeout_ms,
                    max_transaction_timeout_ms=self.config.max_transaction_timeout_ms,
                    now_ms=self._now_ms(),
                    fresh_producer_id=fresh_producer_id, two_phase_commit=two_phase_commit,
                    keep_prepared_txn=keep_prepared_txn, transaction_version=transaction_version,
                    expected=expected,
                )
            except ServiceError as exc:
                await self._confirm_refusal(owned, view, exc)
                raise
            if not plan.persist:
                # A KIP-360 retry answered from memory: not final by itself
                # (a zombie's memory may lag), so confirm it is the log's.
                await self._confirm_plan(owned, view)
                return plan.to_persist.producer_id, plan.to_persist.producer_epoch, None
            write = self._submit(owned, view, [encode_txn(plan.to_persist)])
        await self._written(owned, view, write)
        if md is not None and md.state is not txn.TxnState.DEAD and \
                plan.to_persist.bump_reason == "init":
            # A known id: a new instance moved its epoch, fencing the
            # previous one (a KIP-360 recovery fences nobody else).
            metrics.PRODUCER_FENCINGS.labels("init").inc()
        if plan.abort_started:
            self._start_markers(owned, transactional_id)
            raise ServiceError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"transactional id {transactional_id!r}: aborting the previous "
                "instance's open transaction; retry",
            )
        return (plan.to_persist.producer_id, plan.to_persist.producer_epoch,
                plan.kept_prepared)

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: frozenset[tuple[str, int]],
    ) -> None:
        await self._change(transactional_id, lambda md: txn.plan_add_partitions(
            md, transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=partitions,
            max_partitions=self.config.max_partitions_per_txn, now_ms=self._now_ms(),
        ))

    async def _change(
        self, transactional_id: str,
        plan: Callable[[txn.TxnMetadata | None], txn.TxnMetadata | None],
    ) -> None:
        """A request that changes the transactional id's state (or, planned
        None, leaves it as it is): plan under the lock, persist, replay.

        Arriving while the previous transaction's markers are in flight, it
        waits for them to land; when the marker task has not persisted
        Complete* yet, this request's append carries it, before the new
        state: the log holds the same two records in the same order as when
        they are written one after the other, and the next transaction
        starts one append sooner."""
        owned = self.owned_for(transactional_id)
        task = owned.marker_tasks.get(transactional_id)
        landing = owned.markers_landed.get(transactional_id)
        if task is None or task.done() or landing is None or landing.landed.is_set():
            landing = None
        else:
            landing.waiters += 1
        try:
            if landing is not None and task is not None:
                await self._wait_for_landing(landing, task)
            await self._replanned(lambda: self._change_planned(owned, transactional_id, plan))
        finally:
            if landing is not None:
                landing.leave()

    async def _change_planned(
        self, owned: TxnPartition, transactional_id: str,
        plan: Callable[[txn.TxnMetadata | None], txn.TxnMetadata | None],
    ) -> None:
        async with owned.lock:
            self._runtime.check_loaded(owned)
            view = self._runtime.view(owned)
            current = view.state.transactions.get(transactional_id)
            completed = self._landed_completion(owned, current)
            try:
                planned = plan(completed or current)
            except ServiceError as exc:
                await self._confirm_refusal(owned, view, exc)
                raise
            records = [encode_txn(md) for md in (completed, planned) if md is not None]
            if not records:
                # Nothing written, so nothing proved that memory is still the
                # log's state. A store adding partitions on a producer's
                # behalf appends as soon as this answers, as after a
                # verification, so a zombie's stale "already in the
                # transaction" must not pass (see verify_partitions).
                await self._confirm_plan(owned, view)
                return
            write = self._submit(owned, view, records, completed=completed)
        await self._written(owned, view, write)
        landing = owned.markers_landed.get(transactional_id)
        if completed is not None and landing is not None:
            metrics.TXN_COMPLETION_SECONDS.labels(
                "commit" if completed.state is txn.TxnState.COMPLETE_COMMIT else "abort",
            ).observe(time.perf_counter() - landing.started_s)

    async def verify_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> dict[tuple[str, int], ServiceError | None]:
        """For a partition store: is each partition in this producer's open
        transaction? Answered from memory once memory is confirmed to be the
        log's state (a zombie's memory is not)."""
        owned = self.owned_for(transactional_id)
        await self._confirm_ownership(owned)
        # Memory may have been unloaded or fenced while the check ran.
        owned = self.owned_for(transactional_id)
        return txn.verify_partitions(
            owned.state.transactions.get(transactional_id), transactional_id=transactional_id,
            producer_id=producer_id, producer_epoch=producer_epoch, partitions=partitions,
        )

    def transaction_timeout_ms(self, transactional_id: str) -> int:
        """The timeout of the transactional id's transactions, from memory (0:
        unknown): told to a store with its verification's answer, so that it
        knows how long the transaction may hold its partition open."""
        owned = self.partitions.get(self._layout.transaction_state_partition(transactional_id))
        md = None if owned is None else owned.state.transactions.get(transactional_id)
        return 0 if md is None else md.transaction_timeout_ms

    async def resolve_transaction(
        self, question: hanging.StoreQuestion,
    ) -> dict[int, hanging.StoreAnswer | ServiceError]:
        """A partition store's question about a transaction it has held open
        past its timeout (core/hanging.py): per `__transaction_state`
        partition this node owns, the answer or why there is none now.

        Each answer comes from memory confirmed to be the log's: a zombie's
        "nothing here" would let the store abort a transaction that the real
        coordinator knows, and may be about to commit. And it acts: an open
        transaction past its timeout is aborted now by the timeout path (the
        store's partition among its markers'), a decided one's marker is sent
        to the store's partition."""
        owned_partitions = sorted(self.partitions)
        answers = await asyncio.gather(*(
            self._resolve_in(partition, question) for partition in owned_partitions))
        return dict(zip(owned_partitions, answers, strict=True))

    async def _resolve_in(self, partition: int, question: hanging.StoreQuestion,
                          ) -> hanging.StoreAnswer | ServiceError:
        what = f"{TRANSACTION_STATE_TOPIC}-{partition}"
        try:
            owned = self._runtime.owned(partition, what)
            await self._confirm_ownership(owned)
            # Memory may have been unloaded or fenced while the check ran.
            owned = self._runtime.owned(partition, what)
            found = hanging.answer(owned.state.transactions.values(), question, self._now_ms())
            if found.fate is TxnFate.ABORTING:
                found = await self._abort_hanging(owned, question, found)
            elif found.fate in (TxnFate.DECIDED_ABORT, TxnFate.DECIDED_COMMIT):
                await self._resend_marker(owned, question, found)
        except ServiceError as exc:
            return exc
        metrics.STORE_QUESTIONS.labels(found.fate.name).inc()
        return found

    async def _abort_hanging(self, owned: TxnPartition, question: hanging.StoreQuestion,
                             found: hanging.StoreAnswer) -> hanging.StoreAnswer:
        """The timeout path, now: the store saw the transaction past its
        timeout before this coordinator's timer did (or the timer's abort
        could not reach the store's partition, which it did not know)."""
        return await self._replanned(lambda: self._abort_hanging_planned(owned, question, found))

    async def _abort_hanging_planned(self, owned: TxnPartition,
                                     question: hanging.StoreQuestion,
                                     found: hanging.StoreAnswer) -> hanging.StoreAnswer:
        async with owned.lock:
            self._runtime.check_loaded(owned)
            view = self._runtime.view(owned)
            md = view.state.transactions.get(found.transactional_id)
            planned = None if md is None else hanging.plan_hanging_abort(
                md, question, now_ms=self._now_ms(),
                fresh_producer_id=await self._fresh_id_if_needed(md))
            if planned is None:
                # Changed meanwhile (only by this process: memory is still the
                # log's, once what it saw is durable); say what it says now.
                now = hanging.answer(view.state.transactions.values(), question,
                                     self._now_ms())
                write = None
            else:
                log.info("transaction of %r (producer %d, epoch %d) is held open on %s-%d "
                         "past its timeout of %d ms: aborting", found.transactional_id,
                         question.producer_id, question.producer_epoch,
                         *question.topic_partition, found.transaction_timeout_ms)
                write = self._submit(owned, view, [encode_txn(planned)])
        if write is None:
            await self._runtime.settle(owned, view)
            return now
        await self._written(owned, view, write)
        metrics.TXN_TIMEOUTS.inc()
        metrics.PRODUCER_FENCINGS.labels("timeout").inc()
        self._start_markers(owned, found.transactional_id)
        return found

    async def _resend_marker(self, owned: TxnPartition, question: hanging.StoreQuestion,
                             found: hanging.StoreAnswer) -> None:
        """Sends a decided transaction's marker to the store's partition: a
        Complete* one's (its marker there was lost, or never sent: the
        coordinator did not know the partition was written), or a Prepare*
        one's when its marker task does not cover that partition. Once; the
        store asks again if the transaction stays open."""
        md = owned.state.transactions.get(found.transactional_id)
        if md is None:
            return
        if md.state.is_prepare and question.topic_partition in md.partitions:
            # Its marker task writes this marker. With none on its way (a
            # bug), start one rather than leave the partition held open.
            if not self._markers_on_their_way(owned, found.transactional_id, md):
                log.warning("%r (producer %d, epoch %d) is decided, but no marker task was "
                            "writing its markers (%s-%d asked); starting one",
                            found.transactional_id, question.producer_id,
                            question.producer_epoch, *question.topic_partition)
                self._start_markers(owned, found.transactional_id)
            return
        marker = hanging.decided_marker(md)
        spec = MarkerSpec(
            transactional_id=found.transactional_id, producer_id=marker.producer_id,
            producer_epoch=marker.producer_epoch, commit=marker.commit,
            coordinator_epoch=owned.state.coordinator_epoch,
            transaction_version=marker.transaction_version, timestamp_ms=marker.timestamp_ms,
        )
        results = await self._markers.write(spec, [question.topic_partition])
        for tp, code in results.items():
            metrics.MARKER_WRITES.labels(code.name).inc()
            log.info("%s marker of %r (producer %d, epoch %d) sent again to %s-%d, which held "
                     "the transaction open: %s", "COMMIT" if marker.commit else "ABORT",
                     found.transactional_id, marker.producer_id, marker.producer_epoch,
                     tp[0], tp[1], code.name)

    async def _confirm_ownership(self, owned: TxnPartition) -> None:
        """The shared runtime's confirmation that the log ends where memory
        does (a method of its own: the simulation's "teeth" test replaces it)."""
        await self._runtime.confirm_ownership(owned)

    async def _confirm_plan(self, owned: TxnPartition,
                            view: PlanView[TxnPartitionState]) -> None:
        """An answer planned from memory with nothing written is the log's
        state: what it saw is durable (StalePlan if not), and the log ends
        where memory does (NOT_COORDINATOR if not). The caller holds
        owned.lock."""
        await self._runtime.check_log_end_locked(owned)
        if owned.rollbacks != view.rollbacks:
            raise StalePlan(f"{TRANSACTION_STATE_TOPIC}-{owned.partition}: planned on "
                            "changes that did not become durable")

    async def _confirm_refusal(self, owned: TxnPartition, view: PlanView[TxnPartitionState],
                               refusal: ServiceError) -> None:
        """A refusal planned from memory, with nothing written (PRODUCER_FENCED,
        INVALID_TXN_STATE, ...), is final for the client: it must not come
        from a zombie's stale memory. The caller holds owned.lock; if the log
        has moved on, this raises NOT_COORDINATOR (retriable) instead.
        Most successes need no such check: what they answer from memory
        without a write (a retried EndTxn's decision, a completed
        transaction's outcome) was durable and is final. An add that writes
        nothing is checked (`_change`): a store acts on it at once."""
        if not refusal.code.retriable:
            await self._confirm_plan(owned, view)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      commit: bool) -> tuple[int, int]:
        plan = await self._decide(transactional_id, lambda md, fresh_producer_id: txn.plan_end_txn(
            md, transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, commit=commit, now_ms=self._now_ms(),
            fresh_producer_id=fresh_producer_id,
        ))
        return plan.producer_id, plan.producer_epoch

    async def _decide(
        self, transactional_id: str,
        plan: Callable[[txn.TxnMetadata | None, int | None], _DecisionPlan],
    ) -> _DecisionPlan:
        """EndTxn and CompleteTransaction: plan under the lock (given a fresh
        producer id when the epoch bump needs one), persist the decision, send
        its markers."""
        owned = self.owned_for(transactional_id)
        await self._wait_for_markers(owned, transactional_id)
        return await self._replanned(lambda: self._decide_planned(owned, transactional_id, plan))

    async def _decide_planned(
        self, owned: TxnPartition, transactional_id: str,
        plan: Callable[[txn.TxnMetadata | None, int | None], _DecisionPlan],
    ) -> _DecisionPlan:
        async with owned.lock:
            self._runtime.check_loaded(owned)
            view = self._runtime.view(owned)
            md = view.state.transactions.get(transactional_id)
            fresh_producer_id = await self._fresh_id_if_needed(md, end_txn=True) if md else None
            try:
                planned = plan(md, fresh_producer_id)
            except ServiceError as exc:
                await self._confirm_refusal(owned, view, exc)
                raise
            if isinstance(planned, txn.EndPlan) and planned.confirm_owner:
                # Version 1's success after completion, from memory: see
                # plan_end_txn for why a zombie must not give it.
                await self._confirm_plan(owned, view)
            write = (None if planned.to_persist is None
                     else self._submit(owned, view, [encode_txn(planned.to_persist)]))
        if write is None:
            # A retried decision answered from memory: final once what it
            # saw is durable.
            await self._runtime.settle(owned, view)
            return planned
        await self._written(owned, view, write)
        # The outcome is decided and durable from here on.
        crash_point("coordinator.after_prepare")
        self._start_markers(owned, transactional_id)
        return planned

    async def prepare(self, transactional_id: str, producer_id: int,
                      producer_epoch: int) -> tuple[int, int]:
        """PrepareTransaction (two-phase commit); returns the prepared state."""
        await self._change(transactional_id, lambda md: txn.plan_prepare(
            md, transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, now_ms=self._now_ms(),
        ))
        return producer_id, producer_epoch

    async def complete_prepared(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        prepared: tuple[int, int],
    ) -> tuple[bool, int, int]:
        """CompleteTransaction (two-phase commit): whether `prepared` is
        committed, and the producer id and epoch for the next transaction."""
        plan = await self._decide(
            transactional_id, lambda md, fresh_producer_id: txn.plan_complete_prepared(
                md, transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, prepared=prepared, now_ms=self._now_ms(),
                fresh_producer_id=fresh_producer_id,
            ))
        return plan.committed, plan.producer_id, plan.producer_epoch

    def list_transactions(self) -> list[txn.TxnMetadata]:
        return [md for owned in self._runtime.serving_whole("ListTransactions")
                for md in owned.state.transactions.values()]

    def describe(self, transactional_id: str) -> tuple[txn.TxnMetadata | None, int]:
        owned = self.owned_for(transactional_id)
        return owned.state.transactions.get(transactional_id), owned.state.coordinator_epoch

    async def force_abort(self, transactional_id: str) -> txn.TxnMetadata:
        """The hanging-transaction tool: abort an open transaction (also a
        prepared two-phase-commit one) now, fencing its producer (as a new
        instance's InitProducerId would)."""
        owned = self.owned_for(transactional_id)
        return await self._replanned(lambda: self._force_abort_planned(owned, transactional_id))

    async def _force_abort_planned(self, owned: TxnPartition,
                                   transactional_id: str) -> txn.TxnMetadata:
        async with owned.lock:
            self._runtime.check_loaded(owned)
            view = self._runtime.view(owned)
            md = view.state.transactions.get(transactional_id)
            fresh_producer_id = await self._fresh_id_if_needed(md)
            try:
                planned = txn.plan_admin_abort(
                    md, transactional_id=transactional_id, now_ms=self._now_ms(),
                    fresh_producer_id=fresh_producer_id,
                )
            except ServiceError as exc:
                await self._confirm_refusal(owned, view, exc)
                raise
            write = self._submit(owned, view, [encode_txn(planned)])
        await self._written(owned, view, write)
        metrics.PRODUCER_FENCINGS.labels("admin").inc()
        self._start_markers(owned, transactional_id)
        return planned

    # --------------------------------------------------------------- markers

    @staticmethod
    def _markers_on_their_way(owned: TxnPartition, transactional_id: str,
                              md: txn.TxnMetadata | None) -> bool:
        """Whether a running marker task writes `md`'s markers. A task still
        registered may be the previous decision's: done (its entry goes in a
        done-callback that has not run yet) or persisting its Complete*,
        which then finds the state moved on. Taking it for the new
        decision's once left a decision without markers until a reload."""
        running = owned.marker_tasks.get(transactional_id)
        landing = owned.markers_landed.get(transactional_id)
        return running is not None and not running.done() and (
            landing is None or landing.decided == md)

    def _start_markers(self, owned: TxnPartition, transactional_id: str) -> None:
        # Not loaded: the partition is reloading (after the decision became
        # durable), and the load resumes the markers of every Prepare* state.
        if not owned.loaded:
            return
        md = owned.state.transactions.get(transactional_id)
        if self._markers_on_their_way(owned, transactional_id, md):
            return
        landing = None if md is None else _Landing(md, time.perf_counter())
        task = asyncio.ensure_future(self._complete_with_markers(owned, transactional_id, landing))
        owned.marker_tasks[transactional_id] = task
        if landing is not None:
            owned.markers_landed[transactional_id] = landing

        def forget(_t: asyncio.Task[None]) -> None:
            if owned.marker_tasks.get(transactional_id) is task:
                del owned.marker_tasks[transactional_id]
            if owned.markers_landed.get(transactional_id) is landing:
                del owned.markers_landed[transactional_id]

        task.add_done_callback(forget)

    async def _complete_with_markers(self, owned: TxnPartition, transactional_id: str,
                                     landing: _Landing | None) -> None:
        """Writes markers to every partition of a Prepare* transaction until all
        landed, then persists Complete* (unless the next request for the id
        persisted it first, with its own record: _change)."""
        md = owned.state.transactions.get(transactional_id)
        if md is None or not md.state.is_prepare or landing is None:
            return
        producer_id, producer_epoch = txn.marker_target(md)
        spec = MarkerSpec(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, commit=md.state is txn.TxnState.PREPARE_COMMIT,
            coordinator_epoch=owned.state.coordinator_epoch,
            transaction_version=md.transaction_version,
            timestamp_ms=txn.marker_timestamp(md),
        )
        remaining = set(md.partitions)
        backoff_s = 0.02
        started_s = time.perf_counter()
        while remaining:
            results = await self._markers.write(spec, sorted(remaining))
            for tp, code in results.items():
                metrics.MARKER_WRITES.labels(code.name).inc()
                if code in _MARKER_DONE:
                    remaining.discard(tp)
                elif code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                    log.warning("__transaction_state-%d: a newer coordinator owns it; fenced",
                                owned.partition)
                    self._runtime.fence(owned)
                    return
                elif not code.retriable:
                    # A marker the store refuses for good (e.g. its epoch is not
                    # above the producer's) cannot become acceptable by retrying;
                    # it means the store already saw a later marker. Log loudly.
                    log.error("marker for %r on %s-%d refused: %s", transactional_id,
                              tp[0], tp[1], code.name)
                    remaining.discard(tp)
            if remaining:
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, self.config.marker_retry_backoff_ms_max / 1000)
        landing.landed.set()
        if landing.waiters:
            # A request for the id is waiting: its append carries Complete*.
            await landing.handed.wait()
        crash_point("coordinator.before_complete")
        try:
            if await self._replanned(lambda: self._complete(owned, md)):
                metrics.TXN_COMPLETION_SECONDS.labels("commit" if spec.commit else "abort") \
                    .observe(time.perf_counter() - started_s)
        except ServiceError as exc:
            # The reload resumes the markers (they are idempotent) and completes.
            log.info("completing %r failed: %s; will resume after reload",
                     transactional_id, exc)

    async def _complete(self, owned: TxnPartition, decided: txn.TxnMetadata) -> bool:
        """Persists Complete* of a decided transaction whose markers landed,
        unless its state has moved (a request's append carried it, or the
        partition reloaded); whether it did."""
        async with owned.lock:
            if not owned.loaded:
                return False
            view = self._runtime.view(owned)
            current = view.state.transactions.get(decided.transactional_id)
            # Re-check: the partition may have been reloaded or the state moved.
            if (current is None or current.state != decided.state
                    or current.producer_epoch != decided.producer_epoch):
                return False
            write = self._submit(
                owned, view, [encode_txn(txn.plan_complete(current, now_ms=self._now_ms()))])
        await self._written(owned, view, write)
        return True

    # ----------------------------------------------------------------- timer

    async def _timer_loop(self) -> None:
        while not self._runtime.stopping:
            await asyncio.sleep(self.config.check_interval_ms / 1000)
            for owned in self._runtime.serving():
                try:
                    await self._check_timeouts(owned)
                except ServiceError as exc:
                    log.info("timeout check of __transaction_state-%d: %s",
                             owned.partition, exc)
            self.publish_gauges()

    def publish_gauges(self) -> None:
        """Sets the gauges that summarize memory: transactions by state, the
        oldest Ongoing one, markers in flight, partition statuses. One pass
        with no await, so the numbers agree with each other; the timer
        already walks every transaction this often."""
        now_ms = self._now_ms()
        by_state = dict.fromkeys(txn.TxnState, 0)
        oldest_start_ms: int | None = None
        statuses = dict.fromkeys(metrics.PARTITION_STATUSES, 0)
        markers_pending = 0
        for owned in self.partitions.values():
            if not self._runtime.assigned(owned.partition):
                continue
            status = "fenced" if owned.fenced else "loaded" if owned.loaded else "loading"
            statuses[status] += 1
            if status != "loaded":
                continue
            markers_pending += len(owned.marker_tasks)
            for md in owned.state.transactions.values():
                by_state[md.state] += 1
                if md.state is txn.TxnState.ONGOING and (
                        oldest_start_ms is None or md.txn_start_ms < oldest_start_ms):
                    oldest_start_ms = md.txn_start_ms
        for state, count in by_state.items():
            if state is not txn.TxnState.DEAD:  # expired ids are forgotten, not kept
                metrics.TRANSACTIONS.labels(state.value).set(count)
        for status, count in statuses.items():
            metrics.TXN_LOG_PARTITIONS.labels(status).set(count)
        metrics.MARKERS_PENDING.set(markers_pending)
        metrics.OLDEST_ONGOING_TXN_AGE_SECONDS.set(
            0 if oldest_start_ms is None else max(0, now_ms - oldest_start_ms) / 1000
        )

    async def _check_timeouts(self, owned: TxnPartition) -> None:
        """Aborts the transactions past their timeout and forgets the ids past
        their expiration. The changes are submitted together (one batch, not
        one append each), then awaited; one that fails is found again by the
        next check."""
        now_ms = self._now_ms()
        writes: list[tuple[str, bool, PlanView[TxnPartitionState], _Write]] = []
        for transactional_id, md in list(owned.state.transactions.items()):
            if txn.is_timed_out(md, now_ms):
                async with owned.lock:
                    if not owned.loaded:
                        break
                    view = self._runtime.view(owned)
                    current = view.state.transactions.get(transactional_id)
                    if current is None:
                        continue
                    planned = txn.plan_timeout_abort(
                        current, now_ms=self._now_ms(),
                        fresh_producer_id=await self._fresh_id_if_needed(current),
                    )
                    if planned is None:
                        continue
                    log.info("transaction of %r timed out after %d ms: aborting",
                             transactional_id, current.transaction_timeout_ms)
                    writes.append((transactional_id, True, view,
                                   self._submit(owned, view, [encode_txn(planned)])))
            elif txn.plan_expire(md, now_ms=now_ms,
                                 expiration_ms=self.config.transactional_id_expiration_ms):
                async with owned.lock:
                    if not owned.loaded:
                        break
                    view = self._runtime.view(owned)
                    current = view.state.transactions.get(transactional_id)
                    if current is None or not txn.plan_expire(
                        current, now_ms=self._now_ms(),
                        expiration_ms=self.config.transactional_id_expiration_ms,
                    ):
                        continue
                    writes.append((transactional_id, False, view, self._submit(
                        owned, view, [encode_tombstone(transactional_id)])))
        failed: ServiceError | None = None
        for transactional_id, aborted, view, write in writes:
            try:
                await self._written(owned, view, write)
            except ServiceError as exc:
                failed = failed or exc
                continue
            if aborted:
                metrics.TXN_TIMEOUTS.inc()
                metrics.PRODUCER_FENCINGS.labels("timeout").inc()
                self._start_markers(owned, transactional_id)
        if failed is not None:
            raise failed
