"""The transaction coordinator's runtime: owned `__transaction_state`
partitions, the two-phase commit, timers.

For each request: the pure core plans a new TxnMetadata; the runtime appends
it to the partition's log (a conditional append on the log end offset this
coordinator knows, so a coordinator that lost ownership, or whose earlier
write's outcome is unknown, cannot write past what it has seen); only then is
the record replayed into memory and the reply sent. Any write whose outcome is
uncertain makes the runtime reload the partition from the log, which is the
only source of truth.

Taking over a partition appends a coordinator-epoch record; markers carry that
epoch and the partition stores refuse lower ones, so a zombie coordinator can
neither write the transaction log nor markers.

The one answer given from memory without a write is the partition stores'
verification of a producer's first transactional write to a partition
(`verify_partitions`). A zombie (paused, replaced, not yet fenced because it
has not tried to write) would answer it from a stale view, so it first
confirms that the log still ends where its memory does
(`_confirm_ownership`); docs/coordinator.md says why that is enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from oncelog.errors import ErrorCode
from services.common.cluster import ClusterLayout
from services.common.crashpoints import crash_point
from services.common.service_error import ServiceError, check_id_length
from services.common.tasks import TaskGroup
from services.coordinator import metrics
from services.coordinator.core import transactions as txn
from services.coordinator.core.txn_log import (
    TXN_KEY_PREFIX,
    TxnPartitionState,
    encode_epoch,
    encode_tombstone,
    encode_txn,
)
from services.coordinator.markers import MarkerSender, MarkerSpec
from services.coordinator.runtime import ProducerIdManager
from services.coordinator.storage.txn_log import Entry, TxnLog

log = logging.getLogger(__name__)

# What EndTxn and CompleteTransaction plan: a decision to persist, or None.
_DecisionPlan = TypeVar("_DecisionPlan", txn.EndPlan, txn.CompletePlan)

# Marker results after which a partition needs no more markers: it landed, or
# the partition is gone (a deleted topic gets no marker, as in Kafka).
_MARKER_DONE = {ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnConfig:
    max_txn_timeout_ms: int = 900_000
    # Idle transactional ids are forgotten after this (Kafka: 7 days).
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # How often timeouts and expirations are checked.
    check_interval_ms: int = 1000
    max_partitions_per_txn: int = 1000
    marker_retry_backoff_ms_max: int = 1000
    # How long a request for a transactional id whose markers are in flight
    # waits for them before answering CONCURRENT_TRANSACTIONS.
    wait_for_markers_ms: int = 5000
    # Whether producers may initialize with two-phase commit (KIP-939), whose
    # transactions never time out (Kafka gates it with an ACL).
    allow_two_phase_commit: bool = True


@dataclass
class OwnedPartition:
    partition: int
    state: TxnPartitionState = field(default_factory=TxnPartitionState)
    log_end_offset: int = 0
    loaded: bool = False
    # Another coordinator took the partition over: this one must not touch it.
    fenced: bool = False
    # The coordinator epoch this process claimed (-1: not yet).
    my_epoch: int = -1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    marker_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # Verifications waiting for the next read of the log end (None: nobody
    # waits), and whether the task that runs those reads is alive.
    next_ownership_check: asyncio.Future[None] | None = None
    checking_ownership: bool = False


class TxnCoordinatorRuntime:
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
    ) -> None:
        self._layout = layout
        self._node_id = node_id
        self._log = txn_log
        self._markers = markers
        self._producer_ids = producer_ids
        self._now_ms = now_ms
        self.config = config
        self.partitions = {
            p: OwnedPartition(p)
            for p in range(layout.transaction_state_partitions)
            if layout.coordinator_for_partition(p) == node_id
        }
        self._tasks = TaskGroup()
        self._stopping = False

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Loads every owned partition in the background (the store may still
        be starting) and starts the timer."""
        metrics.MAX_TRANSACTION_TIMEOUT_SECONDS.set(self.config.max_txn_timeout_ms / 1000)
        self.publish_gauges()
        for owned in self.partitions.values():
            self._spawn(self._load_until_done(owned))
        self._spawn(self._timer_loop())

    async def stop(self) -> None:
        self._stopping = True
        await self._tasks.stop(
            task for owned in self.partitions.values() for task in owned.marker_tasks.values()
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def _load_until_done(self, owned: OwnedPartition) -> None:
        backoff_s = 0.05
        while not self._stopping and not owned.loaded and not owned.fenced:
            try:
                async with owned.lock:
                    await self._load(owned)
            except ServiceError as exc:
                log.info("loading __transaction_state-%d: %s; retrying", owned.partition, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)

    async def _load(self, owned: OwnedPartition) -> None:
        """Replays the partition, then claims it with a higher coordinator epoch
        (a reload after an uncertain write keeps the epoch this process claimed,
        unless another coordinator has claimed a newer one: then it is fenced)."""
        entries, log_end = await self._log.read_all(owned.partition)
        state = TxnPartitionState()
        for key, value in entries:
            state.replay(key, value)
        if owned.my_epoch >= 0:
            if state.coordinator_epoch != owned.my_epoch:
                log.warning("__transaction_state-%d: coordinator epoch %d superseded by %d; "
                            "this coordinator is fenced", owned.partition, owned.my_epoch,
                            state.coordinator_epoch)
                owned.fenced = True
                return
            owned.state = state
            owned.log_end_offset = log_end
            owned.loaded = True
            self._resume_markers(owned)
            return
        epoch_record = encode_epoch(state.coordinator_epoch + 1, self._node_id)
        try:
            owned.log_end_offset = await self._log.append(
                owned.partition, [epoch_record], expected_log_end_offset=log_end
            )
        except ServiceError as exc:
            if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH:
                raise ServiceError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                   "the log moved while loading") from exc
            raise
        state.replay(*epoch_record)
        owned.state = state
        owned.my_epoch = state.coordinator_epoch
        owned.loaded = True
        log.info("loaded __transaction_state-%d: coordinator epoch %d, %d transactional ids",
                 owned.partition, state.coordinator_epoch, len(state.transactions))
        self._resume_markers(owned)

    def _resume_markers(self, owned: OwnedPartition) -> None:
        """Prepare* transactions are decided: their markers go out again."""
        for md in owned.state.transactions.values():
            if md.state.is_prepare:
                self._start_markers(owned, md.transactional_id)

    def _unload(self, owned: OwnedPartition) -> None:
        """Forgets memory that may be behind the log; a reload follows."""
        owned.loaded = False
        for task in owned.marker_tasks.values():
            task.cancel()
        owned.marker_tasks.clear()
        self._spawn(self._load_until_done(owned))

    # ------------------------------------------------------------- plumbing

    def owned_for(self, transactional_id: str) -> OwnedPartition:
        # Every request for a transactional id comes here first. The id is
        # stored in __transaction_state's records and named in errors, which
        # must fit in a gRPC status (see limits.MAX_ID_LENGTH).
        check_id_length("transactional_id", transactional_id)
        partition = self._layout.transaction_state_partition(transactional_id)
        owned = self.partitions.get(partition)
        if owned is None or owned.fenced:
            raise ServiceError(
                ErrorCode.NOT_COORDINATOR,
                f"transactional id {transactional_id!r} belongs to __transaction_state-"
                f"{partition}, which coordinator {self._node_id} does not own",
            )
        if not owned.loaded:
            raise ServiceError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"__transaction_state-{partition} is still loading",
            )
        return owned

    async def _persist(self, owned: OwnedPartition, records: Sequence[Entry]) -> None:
        """Appends records and then replays them (counting the state
        transitions); the caller holds owned.lock."""
        try:
            owned.log_end_offset = await self._log.append(
                owned.partition, records, expected_log_end_offset=owned.log_end_offset
            )
        except ServiceError as exc:
            # The outcome is unknown (a lost reply) or the log moved under us
            # (a newer coordinator): memory may be behind the log. Reload.
            self._unload(owned)
            code = (ErrorCode.NOT_COORDINATOR if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH
                    else ErrorCode.COORDINATOR_NOT_AVAILABLE)
            raise ServiceError(code, f"transaction log write failed: {exc.message}") from exc
        for key, value in records:
            if key is None or not key.startswith(TXN_KEY_PREFIX):
                owned.state.replay(key, value)  # a coordinator-epoch record
                continue
            transactional_id = key[len(TXN_KEY_PREFIX):].decode()
            before = owned.state.transactions.get(transactional_id)
            owned.state.replay(key, value)
            after = owned.state.transactions.get(transactional_id)
            metrics.TXN_STATE_TRANSITIONS.labels(
                before.state.value if before else "none",
                after.state.value if after else txn.TxnState.DEAD.value,
            ).inc()

    async def _wait_for_markers(self, owned: OwnedPartition, transactional_id: str) -> None:
        """Holds a request that arrives while the previous transaction's markers
        are in flight until they have landed (bounded), instead of answering
        CONCURRENT_TRANSACTIONS at once: back-to-back transactions then pay no
        client retry round trip."""
        task = owned.marker_tasks.get(transactional_id)
        if task is None or task.done():
            return
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, ServiceError):
            await asyncio.wait_for(asyncio.shield(task), self.config.wait_for_markers_ms / 1000)

    async def _fresh_id_if_needed(self, md: txn.TxnMetadata | None) -> int | None:
        if txn.needs_fresh_producer_id(md):
            return await self._producer_ids.next_producer_id()
        return None

    # ------------------------------------------------------------- requests

    async def init_producer_id(
        self, transactional_id: str, txn_timeout_ms: int, *, two_phase_commit: bool = False,
        keep_prepared_txn: bool = False,
    ) -> tuple[int, int, tuple[int, int] | None]:
        """The producer id and epoch, and the prepared state of a transaction
        kept with keep_prepared_txn (None when none was kept)."""
        if two_phase_commit and not self.config.allow_two_phase_commit:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"transactional id {transactional_id!r}: this coordinator does not allow "
                "two-phase commit (--allow-two-phase-commit is off)",
            )
        owned = self.owned_for(transactional_id)
        await self._wait_for_markers(owned, transactional_id)
        async with owned.lock:
            self._check_loaded(owned)
            md = owned.state.transactions.get(transactional_id)
            fresh_producer_id = await self._fresh_id_if_needed(md)
            try:
                plan = txn.plan_init_producer_id(
                    md, transactional_id=transactional_id, txn_timeout_ms=txn_timeout_ms,
                    max_txn_timeout_ms=self.config.max_txn_timeout_ms, now_ms=self._now_ms(),
                    fresh_producer_id=fresh_producer_id, two_phase_commit=two_phase_commit,
                    keep_prepared_txn=keep_prepared_txn,
                )
            except ServiceError as exc:
                await self._confirm_refusal(owned, exc)
                raise
            await self._persist(owned, [encode_txn(plan.to_persist)])
            if md is not None and md.state is not txn.TxnState.DEAD:
                # A known id: its epoch moved, fencing the previous instance.
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
        None, leaves it as it is): plan under the lock, persist, replay."""
        owned = self.owned_for(transactional_id)
        await self._wait_for_markers(owned, transactional_id)
        async with owned.lock:
            self._check_loaded(owned)
            try:
                planned = plan(owned.state.transactions.get(transactional_id))
            except ServiceError as exc:
                await self._confirm_refusal(owned, exc)
                raise
            if planned is not None:
                await self._persist(owned, [encode_txn(planned)])
            else:
                # Nothing written, so nothing proved that memory is still the
                # log's state. A store adding partitions on a producer's
                # behalf appends as soon as this answers, as after a
                # verification, so a zombie's stale "already in the
                # transaction" must not pass (see verify_partitions).
                await self._check_log_end_locked(owned)

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
        md = owned.state.transactions.get(transactional_id)
        out: dict[tuple[str, int], ServiceError | None] = {}
        for tp in partitions:
            error: ServiceError | None = None
            if md is None or md.state is txn.TxnState.DEAD or md.producer_id != producer_id:
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
            elif md.state is not txn.TxnState.ONGOING or tp not in md.partitions:
                error = ServiceError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"partition {tp[0]}-{tp[1]} is not in an open transaction of "
                    f"{transactional_id!r} (state {md.state.value}); call AddPartitionsToTxn "
                    "before writing",
                )
            out[tp] = error
        return out

    async def _confirm_ownership(self, owned: OwnedPartition) -> None:
        """Returns once a read of the partition's log end that started after
        this call found the log ending where this coordinator's memory ends:
        nobody else has written it, so memory was the log's state at that read.

        Concurrent callers share one read (one that starts after the last of
        them arrived: a read already in flight may have been answered before
        they came), so under load a batch of verifications costs one store
        round trip, not one each. Raises NOT_COORDINATOR when another
        coordinator has written the log (this one reloads, and the reload
        finds it fenced), a retriable error when the store cannot be asked."""
        waiter = owned.next_ownership_check
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            # A waiter whose caller went away leaves its exception unread.
            waiter.add_done_callback(
                lambda f: None if f.cancelled() else f.exception())
            owned.next_ownership_check = waiter
            if not owned.checking_ownership:
                owned.checking_ownership = True
                self._spawn(self._run_ownership_checks(owned))
        await asyncio.shield(waiter)

    async def _run_ownership_checks(self, owned: OwnedPartition) -> None:
        """Answers the waiting verifications with one read each round, until
        none is waiting."""
        try:
            while owned.next_ownership_check is not None:
                waiter, owned.next_ownership_check = owned.next_ownership_check, None
                try:
                    await self._check_log_end(owned)
                except ServiceError as exc:
                    waiter.set_exception(exc)
                except BaseException:
                    waiter.cancel()
                    raise
                else:
                    waiter.set_result(None)
        finally:
            owned.checking_ownership = False
            if owned.next_ownership_check is not None:  # stopped with callers waiting
                owned.next_ownership_check.cancel()
                owned.next_ownership_check = None

    async def _check_log_end(self, owned: OwnedPartition) -> None:
        if await self._read_log_end(owned) == owned.log_end_offset:
            return
        # Our own write may have landed without its answer having come back
        # yet (or have come back after the read): look again once no write
        # of ours is in flight.
        async with owned.lock:
            self._check_loaded(owned)
            await self._check_log_end_locked(owned)

    async def _check_log_end_locked(self, owned: OwnedPartition) -> None:
        """With owned.lock held (no write of ours in flight): the log must end
        where memory does, else another coordinator has written it: reload
        and answer NOT_COORDINATOR."""
        log_end = await self._read_log_end(owned)
        if log_end == owned.log_end_offset:
            return
        log.warning("__transaction_state-%d ends at %d, this coordinator's memory at %d: "
                    "another coordinator has written it; reloading", owned.partition,
                    log_end, owned.log_end_offset)
        self._unload(owned)
        raise ServiceError(
            ErrorCode.NOT_COORDINATOR,
            f"__transaction_state-{owned.partition} was written by another coordinator "
            f"(it ends at {log_end}, coordinator {self._node_id} knows it up to "
            f"{owned.log_end_offset})",
        )

    async def _confirm_refusal(self, owned: OwnedPartition, refusal: ServiceError) -> None:
        """A refusal planned from memory, with nothing written (PRODUCER_FENCED,
        INVALID_TXN_STATE, ...), is final for the client: it must not come
        from a zombie's stale memory. The caller holds owned.lock; if the log
        has moved on, this raises NOT_COORDINATOR (retriable) instead.
        Most successes need no such check: what they answer from memory
        without a write (a retried EndTxn's decision, a completed
        transaction's outcome) was durable and is final. An add that writes
        nothing is checked (`_change`): a store acts on it at once."""
        if not refusal.code.retriable:
            await self._check_log_end_locked(owned)

    async def _read_log_end(self, owned: OwnedPartition) -> int:
        try:
            return await self._log.log_end_offset(owned.partition)
        except ServiceError as exc:
            raise ServiceError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"cannot confirm that coordinator {self._node_id} still owns "
                f"__transaction_state-{owned.partition}: {exc.message}",
            ) from exc

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
        async with owned.lock:
            self._check_loaded(owned)
            md = owned.state.transactions.get(transactional_id)
            fresh_producer_id = await self._fresh_id_if_needed(md) if md else None
            try:
                planned = plan(md, fresh_producer_id)
            except ServiceError as exc:
                await self._confirm_refusal(owned, exc)
                raise
            if planned.to_persist is not None:
                await self._persist(owned, [encode_txn(planned.to_persist)])
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

    def _check_loaded(self, owned: OwnedPartition) -> None:
        if not owned.loaded:
            raise ServiceError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"__transaction_state-{owned.partition} is reloading",
            )

    def list_transactions(self) -> list[txn.TxnMetadata]:
        return [
            md
            for owned in self.partitions.values() if owned.loaded and not owned.fenced
            for md in owned.state.transactions.values()
        ]

    def describe(self, transactional_id: str) -> tuple[txn.TxnMetadata | None, int]:
        owned = self.owned_for(transactional_id)
        return owned.state.transactions.get(transactional_id), owned.state.coordinator_epoch

    async def force_abort(self, transactional_id: str) -> txn.TxnMetadata:
        """The hanging-transaction tool: abort an open transaction (also a
        prepared two-phase-commit one) now, fencing its producer (as a new
        instance's InitProducerId would)."""
        owned = self.owned_for(transactional_id)
        async with owned.lock:
            self._check_loaded(owned)
            md = owned.state.transactions.get(transactional_id)
            fresh_producer_id = await self._fresh_id_if_needed(md)
            try:
                planned = txn.plan_admin_abort(
                    md, transactional_id=transactional_id, now_ms=self._now_ms(),
                    fresh_producer_id=fresh_producer_id,
                )
            except ServiceError as exc:
                await self._confirm_refusal(owned, exc)
                raise
            await self._persist(owned, [encode_txn(planned)])
            metrics.PRODUCER_FENCINGS.labels("admin").inc()
            self._start_markers(owned, transactional_id)
            return planned

    # --------------------------------------------------------------- markers

    def _start_markers(self, owned: OwnedPartition, transactional_id: str) -> None:
        if transactional_id in owned.marker_tasks:
            return
        task = asyncio.ensure_future(self._complete_with_markers(owned, transactional_id))
        owned.marker_tasks[transactional_id] = task

        def forget(_t: asyncio.Task[None]) -> None:
            if owned.marker_tasks.get(transactional_id) is task:
                del owned.marker_tasks[transactional_id]

        task.add_done_callback(forget)

    async def _complete_with_markers(self, owned: OwnedPartition, transactional_id: str) -> None:
        """Writes markers to every partition of a Prepare* transaction until all
        landed, then persists Complete*."""
        md = owned.state.transactions.get(transactional_id)
        if md is None or not md.state.is_prepare:
            return
        producer_id, producer_epoch = txn.marker_target(md)
        spec = MarkerSpec(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, commit=md.state is txn.TxnState.PREPARE_COMMIT,
            coordinator_epoch=owned.state.coordinator_epoch,
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
                    owned.fenced = True
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
        crash_point("coordinator.before_complete")
        async with owned.lock:
            current = owned.state.transactions.get(transactional_id)
            # Re-check: the partition may have been reloaded or the state moved.
            if (not owned.loaded or current is None or current.state != md.state
                    or current.producer_epoch != md.producer_epoch):
                return
            try:
                await self._persist(
                    owned, [encode_txn(txn.plan_complete(current, now_ms=self._now_ms()))]
                )
                metrics.TXN_COMPLETION_SECONDS.labels("commit" if spec.commit else "abort") \
                    .observe(time.perf_counter() - started_s)
            except ServiceError as exc:
                # The reload resumes the markers (they are idempotent) and completes.
                log.info("completing %r failed: %s; will resume after reload",
                         transactional_id, exc)

    # ----------------------------------------------------------------- timer

    async def _timer_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.config.check_interval_ms / 1000)
            for owned in self.partitions.values():
                if owned.loaded and not owned.fenced:
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

    async def _check_timeouts(self, owned: OwnedPartition) -> None:
        now_ms = self._now_ms()
        for transactional_id, md in list(owned.state.transactions.items()):
            if txn.is_timed_out(md, now_ms):
                async with owned.lock:
                    current = owned.state.transactions.get(transactional_id)
                    if current is None or not owned.loaded:
                        continue
                    planned = txn.plan_timeout_abort(
                        current, now_ms=self._now_ms(),
                        fresh_producer_id=await self._fresh_id_if_needed(current),
                    )
                    if planned is None:
                        continue
                    log.info("transaction of %r timed out after %d ms: aborting",
                             transactional_id, current.txn_timeout_ms)
                    await self._persist(owned, [encode_txn(planned)])
                    metrics.TXN_TIMEOUTS.inc()
                    metrics.PRODUCER_FENCINGS.labels("timeout").inc()
                    self._start_markers(owned, transactional_id)
            elif txn.plan_expire(md, now_ms=now_ms,
                                 expiration_ms=self.config.transactional_id_expiration_ms):
                async with owned.lock:
                    current = owned.state.transactions.get(transactional_id)
                    if current is None or not owned.loaded or not txn.plan_expire(
                        current, now_ms=self._now_ms(),
                        expiration_ms=self.config.transactional_id_expiration_ms,
                    ):
                        continue
                    await self._persist(owned, [encode_tombstone(transactional_id)])
