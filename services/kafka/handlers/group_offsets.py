"""OffsetCommit (8), OffsetFetch (9) and TxnOffsetCommit (28): a group's
committed offsets, kept by the group coordinator that owns the group
(forwarded over gRPC). A transactional commit stays pending until its
transaction's marker lands, and OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT for a partition while one is (KIP-447). Kafka's
committed leader epoch is not kept: OffsetFetch answers -1 (unknown), which
makes a consumer skip the epoch check of its restored position."""

from __future__ import annotations

from typing import Any

from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.v1 import records_pb2
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ..context import RequestContext

_GC = "/oncelog.v1.GroupCoordinator/"
NO_OFFSET = -1


def _code(error: Any) -> ErrorCode | None:
    return None if error.code == 0 else ErrorCode.from_wire(error.code)


def _partitions(topics: Any) -> list[gpb.OffsetCommitPartition]:
    return [gpb.OffsetCommitPartition(topic=t.name, partition=int(p.partition_index),
                                       offset=int(p.committed_offset),
                                       metadata=p.committed_metadata or "")
            for t in topics for p in t.partitions]


def _commit_answer(ctx: RequestContext, request: Any, partition_class: str, topic_class: str,
                   results: dict[tuple[str, int], int]) -> Any:
    builder = ctx.builder()
    by_topic: dict[str, list[Any]] = {}
    for t in request.topics:
        for p in t.partitions:
            key = (t.name, int(p.partition_index))
            by_topic.setdefault(t.name, []).append(builder.make(
                partition_class, partition_index=key[1],
                error_code=results.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))))
    return builder.response(throttle_time=0, topics=tuple(
        builder.make(topic_class, name=name, partitions=tuple(parts))
        for name, parts in by_topic.items()))


async def offset_commit(ctx: RequestContext, request: Any) -> Any:
    partitions = _partitions(request.topics)
    proto = gpb.OffsetCommitRequest(
        group_id=request.group_id, generation_id=int(request.generation_id_or_member_epoch),
        member_id=request.member_id or "", partitions=partitions,
        group_instance_id=getattr(request, "group_instance_id", None) or "")
    try:
        ctx.authorize(_GC + "OffsetCommit", proto)
        response = await ctx.broker.coordinators.group(
            request.group_id, "OffsetCommit", proto, gpb.OffsetCommitResponse)
        results = {(r.topic, r.partition): ctx.code(_code(r.error)) for r in response.results}
    except ServiceError as exc:
        results = {(p.topic, p.partition): ctx.code(exc) for p in partitions}
    return _commit_answer(ctx, request, "OffsetCommitResponsePartition",
                          "OffsetCommitResponseTopic", results)


async def txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    partitions = _partitions(request.topics)
    proto = gpb.TxnOffsetCommitRequest(
        transactional_id=request.transactional_id, group_id=request.group_id,
        producer_id=int(request.producer_id), producer_epoch=int(request.producer_epoch),
        # Before v3 (KIP-447) the request names no generation: -1 is not checked.
        generation_id=int(getattr(request, "generation_id", -1)),
        member_id=getattr(request, "member_id", "") or "",
        group_instance_id=getattr(request, "group_instance_id", None) or "",
        partitions=partitions)
    try:
        ctx.authorize(_GC + "TxnOffsetCommit", proto)
        response = await ctx.broker.coordinators.group(
            request.group_id, "TxnOffsetCommit", proto, gpb.TxnOffsetCommitResponse)
        results = {(r.topic, r.partition): ctx.code(_code(r.error)) for r in response.results}
    except ServiceError as exc:
        results = {(p.topic, p.partition): ctx.code(exc) for p in partitions}
    return _commit_answer(ctx, request, "TxnOffsetCommitResponsePartition",
                          "TxnOffsetCommitResponseTopic", results)


async def _fetch_group(ctx: RequestContext, group_id: str, topics: Any,
                       require_stable: bool) -> tuple[int, dict[str, list[tuple[int, int, str,
                                                                                    int]]]]:
    """(group error, topic -> [(partition, offset, metadata, error)])."""
    wanted = None if topics is None else [(t.name, int(p)) for t in topics
                                          for p in t.partition_indexes]
    proto = gpb.OffsetFetchRequest(
        group_id=group_id, require_stable=require_stable,
        partitions=[records_pb2.TopicPartition(topic=t, partition=p)
                    for t, p in wanted or ()])
    found: dict[str, list[tuple[int, int, str, int]]] = {}
    try:
        authorizer = ctx.authorize(_GC + "OffsetFetch", proto)
        response = await ctx.broker.coordinators.group(
            group_id, "OffsetFetch", proto, gpb.OffsetFetchResponse)
        ctx.filter_answer(_GC + "OffsetFetch", proto, response, authorizer)
    except ServiceError as exc:
        return ctx.code(exc), found
    for p in response.partitions:
        found.setdefault(p.topic, []).append(
            (p.partition, p.offset, p.metadata, ctx.code(_code(p.error))))
    return ctx.code(_code(response.error)), found


async def offset_fetch(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    require_stable = bool(getattr(request, "require_stable", False))
    if ctx.version >= 8:
        groups = []
        for group in request.groups:
            error, found = await _fetch_group(ctx, group.group_id, group.topics, require_stable)
            groups.append(builder.make(
                "OffsetFetchResponseGroup", group_id=group.group_id, error_code=error,
                topics=tuple(builder.make("OffsetFetchResponseTopics", name=name, partitions=tuple(
                    builder.make("OffsetFetchResponsePartitions", partition_index=p,
                                 committed_offset=offset, committed_leader_epoch=-1,
                                 metadata=metadata, error_code=code)
                    for p, offset, metadata, code in parts))
                    for name, parts in found.items())))
        return builder.response(throttle_time=0, groups=tuple(groups))
    error, found = await _fetch_group(ctx, request.group_id, request.topics, require_stable)
    return builder.response(
        throttle_time=0, error_code=error,
        topics=tuple(builder.make("OffsetFetchResponseTopic", name=name, partitions=tuple(
            builder.make("OffsetFetchResponsePartition", partition_index=p,
                         committed_offset=offset, committed_leader_epoch=-1, metadata=metadata,
                         error_code=code)
            for p, offset, metadata, code in parts))
            for name, parts in found.items()))
