"""ListOffsets (2) and OffsetForLeaderEpoch (23): where a partition's log
starts and ends, an offset by timestamp, and where a leader epoch ended
(KIP-320: a consumer checks after a leader change that its position is
still in the log)."""

from __future__ import annotations

from typing import Any

from oncelog.v1 import partition_store_pb2 as pb

from ...common.kernel.errors import ServiceError
from ...partition_store.api import OffsetQuery
from ...partition_store.log.partition import Isolation
from ..context import RequestContext

LIST_OFFSETS_METHOD = "/oncelog.v1.PartitionStore/ListOffsets"
EPOCH_METHOD = "/oncelog.v1.PartitionStore/OffsetsForLeaderEpoch"
READ_COMMITTED = 1


async def list_offsets(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    committed = ctx.version >= 2 and int(request.isolation_level) == READ_COMMITTED
    queries = [OffsetQuery(topic.name, int(p.partition_index), int(p.timestamp))
               for topic in request.topics for p in topic.partitions]
    by_topic: dict[str, list[Any]] = {}
    try:
        ctx.authorize(LIST_OFFSETS_METHOD, pb.ListOffsetsRequest(partitions=[
            pb.ListOffsetsPartition(topic=q.topic, partition=q.partition) for q in queries]))
    except ServiceError as exc:
        for q in queries:
            by_topic.setdefault(q.topic, []).append(builder.make(
                "ListOffsetsPartitionResponse", partition_index=q.partition,
                error_code=ctx.code(exc), timestamp=-1, offset=-1, leader_epoch=-1))
        queries = []
    if queries:
        runtime = ctx.broker.runtime
        outcomes = await runtime.list_offsets(
            queries, isolation=Isolation.READ_COMMITTED if committed
            else Isolation.READ_UNCOMMITTED)
        for o in outcomes:
            epoch = runtime.partition_state(o.topic, o.partition).leader_epoch
            by_topic.setdefault(o.topic, []).append(builder.make(
                "ListOffsetsPartitionResponse", partition_index=o.partition,
                error_code=ctx.code(o.error), timestamp=o.timestamp_ms, offset=o.offset,
                leader_epoch=epoch if o.error is None else -1,
                # ListOffsets v0 answered a list of offsets.
                old_style_offsets=(o.offset,)))
    return builder.response(
        throttle_time=0,
        topics=tuple(builder.make("ListOffsetsTopicResponse", name=name, partitions=tuple(parts))
                     for name, parts in by_topic.items()))


async def offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    queries = [(topic.topic, int(p.partition), int(p.leader_epoch),
                int(getattr(p, "current_leader_epoch", -1)))
               for topic in request.topics for p in topic.partitions]
    by_topic: dict[str, list[Any]] = {}
    try:
        ctx.authorize(EPOCH_METHOD, pb.OffsetsForLeaderEpochRequest(partitions=[
            pb.EpochQuery(topic=t, partition=p) for t, p, _e, _c in queries]))
        outcomes = ctx.broker.runtime.offsets_for_leader_epoch(queries)
        for o in outcomes:
            by_topic.setdefault(o.topic, []).append(builder.make(
                "EpochEndOffset", error_code=ctx.code(o.error), partition=o.partition,
                leader_epoch=o.leader_epoch, end_offset=o.end_offset))
    except ServiceError as exc:
        for t, p, _e, _c in queries:
            by_topic.setdefault(t, []).append(builder.make(
                "EpochEndOffset", error_code=ctx.code(exc), partition=p, leader_epoch=-1,
                end_offset=-1))
    return builder.response(
        throttle_time=0,
        topics=tuple(builder.make("OffsetForLeaderTopicResult", topic=t, partitions=tuple(ps))
                     for t, ps in by_topic.items()))
