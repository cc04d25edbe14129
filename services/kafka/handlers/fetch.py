"""Fetch (1): whole stored batches, as Kafka's clients read them.

Kafka's clients filter by themselves: under read_committed they are given
every batch below the last stable offset — control batches and batches of
aborted transactions included — with `aborted_transactions` (producer id,
first offset) for the returned range, and drop the aborted batches
themselves; under read_uncommitted everything below the high watermark,
with `aborted_transactions` null. They take the next offset from the last
batch they were given, so nothing below the bound is left out (not even
batches compaction emptied). Our own SDK keeps the server-side filtering
of its gRPC Fetch.

Fetch sessions (KIP-227) are not kept: every answer says session id 0,
which tells the client to send full fetches (as a broker whose session
cache is full does).

Client quotas (partition_store/quotas.py): as Kafka's broker, a fetch is cut
to what the consumer quota of the connection's principal and the header's
client_id allows in one window, and a fetch that puts the client over its
quota is answered with its throttle time and no partitions at all (Kafka's
throttled response), so the client fetches the same offsets again later —
unless the answer alone is larger than a window allows (a first batch
larger than that), which is answered whole with its throttle time
(StoreQuotas.fetched says why).
"""

from __future__ import annotations

from typing import Any

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...partition_store.api import FetchItem
from ...partition_store.core.quotas import QuotaKind
from ...partition_store.log.partition import Isolation
from ...partition_store.quotas import NOT_THROTTLED, exempt
from ..context import RequestContext

FETCH_METHOD = "/oncelog.v1.PartitionStore/Fetch"
# Kafka's consumers send replica id -1 (followers replicate over our gRPC).
CONSUMER_REPLICA_ID = -1
READ_COMMITTED = 1


async def handle(ctx: RequestContext, request: Any) -> Any:
    quotas = ctx.broker.quotas
    if quotas is not None and (not quotas.enabled or exempt(t.topic for t in request.topics)):
        quotas = None
    principal = ctx.session.caller.principal
    client_id = ctx.header.client_id or ""
    if quotas is not None:
        await quotas.hold(QuotaKind.FETCH, principal, client_id)
    builder = ctx.builder()
    committed = ctx.version >= 4 and int(request.isolation_level) == READ_COMMITTED
    items: list[FetchItem] = []
    refused: dict[tuple[str, int], ServiceError] = {}
    for topic in request.topics:
        for part in topic.partitions:
            epoch = int(getattr(part, "current_leader_epoch", -1))
            items.append(FetchItem(topic.topic, int(part.partition), int(part.fetch_offset),
                                   max(int(part.partition_max_bytes), 0),
                                   epoch if epoch >= 0 else None))
    replica_id = int(getattr(request, "replica_id", CONSUMER_REPLICA_ID))
    error: ServiceError | None = None
    if replica_id != CONSUMER_REPLICA_ID:
        error = ServiceError(ErrorCode.INVALID_REQUEST,
                             f"replica id {replica_id}: stores replicate over gRPC; "
                             "a Kafka client fetches with replica id -1")
    elif any(i.fetch_offset < 0 for i in items):
        bad = next(i for i in items if i.fetch_offset < 0)
        refused[(bad.topic, bad.partition)] = ServiceError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{bad.topic}-{bad.partition}: fetch offset {bad.fetch_offset} is negative")
        items = [i for i in items if i.fetch_offset >= 0]
    if error is None and items:
        try:
            ctx.authorize(FETCH_METHOD, pb.FetchRequest(partitions=[
                pb.FetchPartition(topic=t, partition=p)
                for t, p in dict.fromkeys((i.topic, i.partition) for i in items)]))
        except ServiceError as exc:
            refused.update({(i.topic, i.partition): exc for i in items})
            items = []
    by_topic: dict[str, list[Any]] = {}
    throttle_ms = 0
    if error is None and items:
        wait_ms = max(int(request.max_wait.total_seconds() * 1000), 0)
        max_bytes = max(int(getattr(request, "max_bytes", 0)) or 0, 0)
        if quotas is not None:
            max_bytes = quotas.fetch_max_bytes(principal, client_id, max_bytes)
        outcomes = await ctx.broker.runtime.fetch(
            items, max_wait_ms=wait_ms, min_bytes=max(int(request.min_bytes), 0),
            max_bytes=max_bytes,
            isolation=Isolation.READ_COMMITTED if committed else Isolation.READ_UNCOMMITTED,
            client_filters=True)
        throttle = NOT_THROTTLED if quotas is None else quotas.fetched(
            principal, client_id, sum(len(b) for o in outcomes for b in o.batches))
        throttle_ms = throttle.throttle_time_ms
        if throttle.withhold_batches:
            return builder.response(throttle_time=throttle_ms, error_code=0, session_id=0,
                                    responses=())
        for o in outcomes:
            aborted = None
            if committed:
                aborted = tuple(builder.make("AbortedTransaction", producer_id=a.producer_id,
                                             first_offset=a.first_offset)
                                for a in o.aborted)
            by_topic.setdefault(o.topic, []).append(builder.make(
                "PartitionData", partition_index=o.partition, error_code=ctx.code(o.error),
                high_watermark=o.high_watermark, last_stable_offset=o.last_stable_offset,
                log_start_offset=o.log_start_offset, aborted_transactions=aborted,
                preferred_read_replica=-1, records=b"".join(o.batches)))
    for (topic, partition), refusal in refused.items():
        by_topic.setdefault(topic, []).append(builder.make(
            "PartitionData", partition_index=partition, error_code=ctx.code(refusal),
            high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
            aborted_transactions=None, preferred_read_replica=-1, records=b""))
    return builder.response(
        throttle_time=throttle_ms, error_code=ctx.code(error), session_id=0,
        responses=tuple(builder.make("FetchableTopicResponse", topic=topic,
                                     partitions=tuple(parts))
                        for topic, parts in by_topic.items()))
