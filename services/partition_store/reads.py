"""Reads on one store node: Fetch (whole batches below the HW, or the LSO
under read_committed with aborted transactions and markers filtered out;
long-polls on the partitions' HW/LSO waiters up to max_wait_ms),
ListOffsets and DescribeProducers. Owns nothing: the partitions come from
the catalog (catalog.py), and every read is answered from their state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..common.kernel import limits
from ..common.kernel.errors import ServiceError
from . import metrics
from .api import FetchItem, FetchOutcome, OffsetOutcome, OffsetQuery, ProducersOutcome
from .catalog import Catalog
from .log import reads as partition_reads
from .log.partition import Isolation, PartitionRuntime
from .shared import StoreShared
from .storage.port import CorruptionError

log = logging.getLogger("oncelog.partition_store")

# Per-partition fetch limit when the request leaves it at 0 (Kafka's
# max.partition.fetch.bytes default).
DEFAULT_PARTITION_FETCH_MAX_BYTES = 1024 * 1024


class Reads:
    """Answers consumers' reads (see the module docstring)."""

    def __init__(self, shared: StoreShared, catalog: Catalog) -> None:
        self._shared = shared
        self._catalog = catalog

    async def fetch(
        self,
        items: Sequence[FetchItem],
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 0,
        max_bytes: int = 0,
        isolation: Isolation = Isolation.READ_UNCOMMITTED,
        include_control: bool = False,
        client_filters: bool = False,
    ) -> list[FetchOutcome]:
        """Reads every item; when fewer than min_bytes are available, waits up
        to max_wait_ms for any of the partitions' HW (LSO under
        read_committed) to move and reads again. Bytes filtered out (markers,
        aborted transactions) count toward min_bytes and max_bytes: they are
        work done, and a fetch that skipped them answers at once with a
        next_fetch_offset past them rather than waiting with nothing new.
        `client_filters`: for readers that filter by themselves (Kafka's
        clients; partition_reads.read says what changes)."""
        await self._catalog.ensure_known({item.topic for item in items},
                                 [(item.topic, item.partition) for item in items])
        loop = asyncio.get_running_loop()
        wait_s = min(max(max_wait_ms, 0), limits.MAX_FETCH_WAIT_MS) / 1000
        deadline = loop.time() + wait_s
        # Capped, as Kafka's broker caps a fetch at its fetch.max.bytes: a
        # larger response would not fit in a gRPC message (every retry of the
        # client would fail the same way).
        budget = min(max_bytes or limits.DEFAULT_FETCH_MAX_BYTES, limits.DEFAULT_FETCH_MAX_BYTES)
        while True:
            outcomes, size, parts, failed = self._fetch_once(
                items, budget, isolation, include_control, client_filters
            )
            remaining_s = deadline - loop.time()
            if size >= min_bytes or failed or remaining_s <= 0 or self._shared.closing:
                _count_fetched(outcomes)
                return outcomes
            waiter: asyncio.Future[None] = loop.create_future()
            for part in parts:
                part.add_waiter(waiter, isolation)
            try:
                await asyncio.wait_for(waiter, remaining_s)
            except TimeoutError:
                pass
            finally:
                for part in parts:
                    part.remove_waiter(waiter)

    def _fetch_once(
        self, items: Sequence[FetchItem], budget_bytes: int, isolation: Isolation,
        include_control: bool = False, client_filters: bool = False,
    ) -> tuple[list[FetchOutcome], int, list[PartitionRuntime], bool]:
        outcomes = []
        parts = []
        total = 0
        failed = False
        for item in items:
            try:
                part = self._catalog.resolve_leader(item.topic, item.partition,
                                            item.current_leader_epoch)
                parts.append(part)
                limit = min(item.max_bytes or DEFAULT_PARTITION_FETCH_MAX_BYTES,
                            budget_bytes - total)
                # Only the first partition with data may go over the budget
                # (by one batch, so a fetch always makes progress); the
                # response holds at most max(budget, one batch).
                try:
                    read = partition_reads.read(
                        part, item.fetch_offset, max_bytes=limit, isolation=isolation,
                        include_control=include_control, take_first_whole=total == 0,
                        client_filters=client_filters)
                except CorruptionError as damage:
                    raise self._shared.report_damage(damage) from damage
            except ServiceError as exc:
                failed = True
                outcomes.append(FetchOutcome(
                    item.topic, item.partition, exc, next_fetch_offset=item.fetch_offset
                ))
                continue
            total += read.scanned_bytes
            outcomes.append(FetchOutcome(
                item.topic, item.partition, None,
                high_watermark=part.log.high_watermark,
                last_stable_offset=part.log.last_stable_offset,
                log_start_offset=part.log.log_start_offset,
                batches=tuple(read.batches),
                next_fetch_offset=read.next_fetch_offset,
                record_count=read.record_count,
                size_bytes=read.size_bytes,
                aborted=read.aborted,
            ))
        return outcomes, total, parts, failed

    async def list_offsets(
        self, queries: Sequence[OffsetQuery], *, isolation: Isolation
    ) -> list[OffsetOutcome]:
        await self._catalog.ensure_known({q.topic for q in queries},
                                 [(q.topic, q.partition) for q in queries])
        outcomes = []
        for q in queries:
            try:
                offset, ts = partition_reads.list_offset(
                    self._catalog.resolve_leader(q.topic, q.partition), q.timestamp_ms, isolation
                )
            except CorruptionError as damage:
                outcomes.append(OffsetOutcome(
                    q.topic, q.partition, self._shared.report_damage(damage)))
                continue
            except ServiceError as exc:
                outcomes.append(OffsetOutcome(q.topic, q.partition, exc))
                continue
            outcomes.append(OffsetOutcome(q.topic, q.partition, None, offset, ts))
        return outcomes

    async def describe_producers(
        self, partitions: Sequence[tuple[str, int]]
    ) -> list[ProducersOutcome]:
        await self._catalog.ensure_known({t for t, _p in partitions})
        outcomes = []
        for topic, p in partitions:
            try:
                part = self._catalog.resolve_leader(topic, p)
            except ServiceError as exc:
                outcomes.append(ProducersOutcome(topic, p, exc))
                continue
            outcomes.append(ProducersOutcome(topic, p, None, tuple(part.producers.entries())))
        return outcomes


def _count_fetched(outcomes: Sequence[FetchOutcome]) -> None:
    for o in outcomes:
        if o.batches:
            metrics.FETCH_RECORDS.labels(o.topic).inc(o.record_count)
            metrics.FETCH_BYTES.labels(o.topic).inc(o.size_bytes)

