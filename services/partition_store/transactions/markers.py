"""Transaction markers on one store node.

* WriteTxnMarkers: check each marker per partition (core/producer_state.py),
  append its control batch through the same group commit as produce,
  answer when durable.
* Hanging transactions: one held open on a partition led here past its
  timeout plus a margin is asked about (TxnResolver) and ended by its
  coordinator, or by this store, with an ABORT marker, when no coordinator
  knows it (core/hanging_txns.py). Housekeeping runs the check every tick.

Owns the hanging-transaction bookkeeping (when to ask next, the questions
in flight, what was counted); partitions come from the catalog."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from oncelog.wire.errors import ErrorCode

from ...common.kernel import limits
from ...common.kernel.crashpoints import crash_point
from ...common.kernel.errors import ServiceError
from ...common.kernel.invariants import InvariantViolation
from .. import metrics
from ..api import MarkerItem, MarkerOutcome
from ..catalog import Catalog
from ..core import hanging_txns
from ..core.outcomes import Rejection
from ..core.producer_state import DuplicateMarker, TxnMarker
from ..log.partition import Appended, PartitionRuntime
from ..shared import StoreShared, durable_callback
from .resolver import HangingQuestion, TxnResolver

log = logging.getLogger("oncelog.partition_store")


class TxnMarkers:
    """Writes transaction markers and ends hanging transactions."""

    def __init__(self, shared: StoreShared, catalog: Catalog, *,
                 txn_resolver: TxnResolver | None) -> None:
        self._shared = shared
        self.config = shared.config
        self.layout = shared.layout
        self._writer = shared.writer
        self._clock_ms = shared.clock_ms
        self._catalog = catalog
        # None: hanging transactions stay until an operator aborts them.
        self._txn_resolver = txn_resolver
        self._hanging_policy = hanging_txns.HangingPolicy(
            max_transaction_timeout_ms=self.config.max_transaction_timeout_ms,
            margin_ms=self.config.hanging_txn_margin_ms)
        # Per overdue transaction (topic, partition, producer id, first
        # offset): when to ask about it next, and whether it was counted.
        self._hanging_next_ms: dict[tuple[str, int, int, int], int] = {}
        self._hanging_in_flight: set[tuple[str, int, int, int]] = set()
        self._hanging_counted: set[tuple[str, int, int, int]] = set()

    async def write_txn_markers(
        self, markers: Sequence[MarkerItem], *, timeout_ms: int = 0
    ) -> list[MarkerOutcome]:
        """Writes each marker to each partition it names (in request order),
        by the rules of core/producer_state.py; answers once every written
        marker is durable. An identical retry of a producer's last marker
        answers with its offset and writes nothing."""
        crash_point("store.before_marker_write")
        await self._catalog.ensure_known({t for m in markers for t, _p in m.partitions})
        now_ms = self._clock_ms()
        outcomes: list[MarkerOutcome] = []
        waits: dict[int, asyncio.Future[None]] = {}
        for item in markers:
            marker = TxnMarker(
                item.producer_id, item.producer_epoch, item.control_type, item.coordinator_epoch,
                transaction_version=item.transaction_version, timestamp_ms=item.timestamp_ms,
            )
            for topic, partition in item.partitions:
                try:
                    self._shared.check_accepting()
                    part = self._catalog.resolve_leader(topic, partition)
                    self._catalog.check_enough_replicas(part)
                    result = part.append_marker(marker, now_ms=now_ms)
                except ServiceError as exc:
                    outcomes.append(MarkerOutcome(item.producer_id, topic, partition, exc))
                    continue
                if isinstance(result, DuplicateMarker):
                    offset = result.offset
                    pending = part.pending_future(offset)
                    if pending is not None:
                        waits[len(outcomes)] = pending
                else:
                    offset = result.base_offset
                    future = self._writer.submit(
                        result.group,
                        on_durable=durable_callback(part, result.base_offset, result.next_offset),
                    )
                    waits[len(outcomes)] = part.track_pending(
                        result.base_offset, result.next_offset, future
                    )
                    self._shared.maybe_snapshot(part, now_ms)
                    log.info(
                        "%s: %s marker of producer %d (epoch %d, coordinator epoch %d) at "
                        "offset %d", part.topic_partition, marker.name, marker.producer_id,
                        marker.producer_epoch, marker.coordinator_epoch, offset,
                    )
                outcomes.append(MarkerOutcome(item.producer_id, topic, partition, None, offset))
        for index, error in (await self._shared.await_durable(waits, timeout_ms)).items():
            failed = outcomes[index]
            if error.code is ErrorCode.REQUEST_TIMED_OUT:
                error = ServiceError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{failed.topic}-{failed.partition}: the marker at offset {failed.offset} "
                    f"{error.message}; retry (an identical retry is not written again)",
                )
            outcomes[index] = MarkerOutcome(failed.producer_id, failed.topic, failed.partition,
                                            error)
        # The markers are durable but the coordinator has not heard so.
        crash_point("store.after_marker_durable")
        return outcomes


    # --------------------------------------------------- hanging transactions

    def check_hanging_txns(self, now_ms: int) -> list[asyncio.Task[None]]:
        """Asks the coordinators about every transaction that has held a
        partition led here open past its timeout plus the margin
        (core/hanging_txns.py), each in a task of its own: one question in
        flight per transaction, at most limits.MAX_HANGING_TXN_QUESTIONS at
        once, the next one `retry_ms` after an answer that leaves it open.
        Returns the tasks it started (tests await them). Synchronous and
        O(open transactions): housekeeping runs it every tick."""
        if not self.config.resolve_hanging_txns or self._txn_resolver is None:
            return []
        policy = self._hanging_policy
        still_open: set[tuple[str, int, int, int]] = set()
        started: list[asyncio.Task[None]] = []
        for part in list(self._catalog.partitions.values()):
            if part.closed or not part.is_leader or part.producers.open_txn_count == 0:
                continue
            for txn in part.open_transactions():
                key = (part.topic.name, part.partition, txn.producer_id, txn.first_offset)
                still_open.add(key)
                if key in self._hanging_in_flight or now_ms < self._hanging_next_ms.get(
                        key, policy.overdue_at_ms(txn)):
                    continue
                if len(self._hanging_in_flight) >= limits.MAX_HANGING_TXN_QUESTIONS:
                    continue  # the next tick asks
                self._hanging_in_flight.add(key)
                started.append(self._shared.spawn(self._resolve_hanging(part, txn, key)))
        # Transactions that ended (or whose partition is no longer led here)
        # are forgotten; one in flight is forgotten when its question ends.
        gone = (self._hanging_next_ms.keys() | self._hanging_counted) - still_open \
            - self._hanging_in_flight
        for key in gone:
            self._hanging_next_ms.pop(key, None)
            self._hanging_counted.discard(key)
        return started

    async def _resolve_hanging(self, part: PartitionRuntime, txn: hanging_txns.OpenTxn,
                               key: tuple[str, int, int, int]) -> None:
        policy = self._hanging_policy
        resolver = self._txn_resolver
        try:
            if resolver is None:
                return
            question = HangingQuestion(
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                topic=part.topic.name, partition=part.partition,
                last_marker_timestamp_ms=txn.last_marker_timestamp_ms)
            answers = await resolver.resolve(question)
            resolution = hanging_txns.decide(
                {p: a.fate for p, a in answers.items()},
                partitions=self.layout.transaction_state_partitions)
            knows = next((a for a in answers.values() if a.transactional_id), None)
            now_ms = self._clock_ms()
            age_ms = now_ms - txn.start_time_ms
            entry = part.producers.get(txn.producer_id)
            if knows is not None and knows.transaction_timeout_ms > 0 and entry is not None \
                    and entry.current_txn_first_offset == txn.first_offset:
                part.txn_timeouts_ms[txn.producer_id] = knows.transaction_timeout_ms
            who = (f"{part.topic_partition}: the transaction of producer {txn.producer_id} "
                   f"(epoch {txn.producer_epoch}) open since offset {txn.first_offset} for "
                   f"{age_ms} ms")
            coordinator = (f"its coordinator (transactional id {knows.transactional_id!r})"
                           if knows is not None else "its coordinator")
            if resolution is hanging_txns.Resolution.STORE_ABORTS:
                await self._abort_hanging(part, txn, age_ms=age_ms, who=who)
            elif resolution is hanging_txns.Resolution.COORDINATOR_ABORTS:
                if key not in self._hanging_counted:
                    self._hanging_counted.add(key)
                    metrics.AUTO_ABORTED_TRANSACTIONS.labels(part.topic.name, "coordinator").inc()
                    log.warning("%s, past its timeout of %d ms: %s is aborting it", who,
                                policy.timeout_of(txn), coordinator)
            elif resolution is hanging_txns.Resolution.COORDINATOR_COMMITS:
                log.warning("%s, past its timeout of %d ms: %s decided to commit it; its "
                            "COMMIT marker is on its way", who, policy.timeout_of(txn),
                            coordinator)
            elif resolution is hanging_txns.Resolution.WAIT_OPEN:
                log.info("%s: %s holds it open (%s); asking again in %d ms", who, coordinator,
                         ", ".join(sorted({a.fate.name for a in answers.values()
                                           if a.transactional_id})), policy.retry_ms)
            else:
                missing = sorted(set(range(self.layout.transaction_state_partitions))
                                 - set(answers))
                log.info("%s: no coordinator knows it, but __transaction_state partitions %s "
                         "did not answer; asking again in %d ms", who, missing, policy.retry_ms)
        except ServiceError as exc:
            log.warning("%s: ending the hanging transaction of producer %d failed: %s",
                        part.topic_partition, txn.producer_id, exc)
        finally:
            self._hanging_in_flight.discard(key)
            self._hanging_next_ms[key] = self._clock_ms() + policy.retry_ms

    async def _abort_hanging(self, part: PartitionRuntime, txn: hanging_txns.OpenTxn, *,
                             age_ms: int, who: str) -> None:
        """No coordinator knows the transaction: writes its ABORT marker
        (core/hanging_txns.py, store_abort_marker) through the marker path,
        if it is still open as it was and the partition still led here by
        the same runtime; waits until the marker is durable."""
        self._shared.check_accepting()
        if self._catalog.resolve_leader(part.topic.name, part.partition) is not part:
            return
        entry = part.producers.get(txn.producer_id)
        if entry is None or not entry.has_open_txn:
            return  # ended meanwhile
        marker = hanging_txns.store_abort_marker(entry, txn)
        if isinstance(marker, Rejection):
            if marker.code is not ErrorCode.INVALID_TXN_STATE:
                log.error("%s: no coordinator knows it, and %s", who, marker.message)
            return
        self._catalog.check_enough_replicas(part)
        now_ms = self._clock_ms()
        result = part.append_marker(marker, now_ms=now_ms,
                                    timestamp_ms=hanging_txns.STORE_ABORT_TIMESTAMP_MS)
        if not isinstance(result, Appended):
            raise InvariantViolation(f"{part.topic_partition}: a store's abort answered {result!r}")
        future = self._writer.submit(
            result.group,
            on_durable=durable_callback(part, result.base_offset, result.next_offset))
        wait = part.track_pending(result.base_offset, result.next_offset, future)
        self._shared.maybe_snapshot(part, now_ms)
        failed = (await self._shared.await_durable({0: wait}, 0)).get(0)
        if failed is not None:
            raise failed
        metrics.AUTO_ABORTED_TRANSACTIONS.labels(part.topic.name, "store").inc()
        log.warning(
            "%s, past its timeout of %d ms plus the margin of %d ms: no transaction "
            "coordinator knows it (its record lost, or the producer moved on without its "
            "marker); aborted it here with an ABORT marker at offset %d (epoch %d, "
            "coordinator epoch %d)", who, self._hanging_policy.timeout_of(txn),
            self._hanging_policy.margin_ms, result.base_offset, marker.producer_epoch,
            marker.coordinator_epoch)

