"""Produce (0): the batches go to the store's append as they came.

A Kafka client's batch is Kafka's record batch v2, which is also the
store's format: it is appended byte for byte (stamped with its offset and
leader epoch, as every batch is), with the same append rules as over gRPC —
sequence numbers, epochs, and the verification of a transactional
producer's first write to a partition with its transaction coordinator
(KIP-890 part 1). A partition's records normally hold one batch; several
are split and appended in order (the answer gives the first one's offset).

acks: Kafka's acks=0 takes no answer (a failure closes the connection, as
Kafka's broker does, so the client notices); acks=1 and acks=-1 both answer
once the append is durable on every in-sync replica (the store has no
leader-only acknowledgement: acks=1 gets the stronger guarantee). The
producer's timeout bounds the wait for durability.

Client quotas (partition_store/quotas.py): the request counts against the
producer quota of the connection's principal and the header's client_id,
as a gRPC Produce does; the answer carries the throttle time, and the
client's Produce requests that come before it has passed wait for it.
"""

from __future__ import annotations

import struct
from typing import Any

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...partition_store.api import ProduceItem, ProduceOutcome
from ...partition_store.core.quotas import QuotaKind
from ...partition_store.quotas import exempt
from ..context import CloseConnection, RequestContext

PRODUCE_METHOD = "/oncelog.v1.PartitionStore/Produce"
# A batch's base_offset (int64) and batch_length (int32): its size is 12 + length.
_BATCH_PREFIX = struct.Struct(">qi")


def split_batches(records: bytes) -> list[bytes]:
    """The record batches one partition's records hold, as the client sent
    them. A length that runs past the end leaves the rest as one piece,
    which the store refuses with a message naming what is wrong."""
    out = []
    pos = 0
    end = len(records)
    while pos < end:
        if end - pos < _BATCH_PREFIX.size:
            out.append(records[pos:])
            break
        _base, length = _BATCH_PREFIX.unpack_from(records, pos)
        size = _BATCH_PREFIX.size + length
        if length <= 0 or pos + size > end:
            out.append(records[pos:])
            break
        out.append(records[pos:pos + size] if (pos, size) != (0, end) else records)
        pos += size
    return out


async def handle(ctx: RequestContext, request: Any) -> Any:
    quotas = ctx.broker.quotas
    if quotas is not None and (not quotas.enabled or exempt(t.name for t in request.topic_data)):
        quotas = None
    principal = ctx.session.caller.principal
    client_id = ctx.header.client_id or ""
    if quotas is not None:
        await quotas.hold(QuotaKind.PRODUCE, principal, client_id)
    builder = ctx.builder()
    acks = int(request.acks)
    transactional_id = request.transactional_id or ""
    # (topic, partition) -> the error answered without appending.
    refused: dict[tuple[str, int], ServiceError] = {}
    items: list[ProduceItem] = []
    # Each item's (topic, partition); a partition split into batches has several.
    for topic in request.topic_data:
        for part in topic.partition_data:
            key = (topic.name, int(part.index))
            if key in refused or any((i.topic, i.partition) == key for i in items):
                refused[key] = ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"{topic.name}-{part.index} appears twice in one Produce request")
                continue
            if not part.records:
                refused[key] = ServiceError(ErrorCode.CORRUPT_MESSAGE,
                                            f"{topic.name}-{part.index}: no record batch")
                continue
            for batch in split_batches(bytes(part.records)):
                items.append(ProduceItem(topic.name, int(part.index), batch))
    if acks not in (-1, 0, 1):
        refused.update({(i.topic, i.partition): ServiceError(
            ErrorCode.INVALID_REQUEST, f"acks is {acks}; Kafka's choices are -1, 0 and 1")
            for i in items})
        items = []
    if items:
        try:
            ctx.authorize(PRODUCE_METHOD, pb.ProduceRequest(
                transactional_id=transactional_id,
                batches=[pb.PartitionBatch(topic=t, partition=p)
                         for t, p in dict.fromkeys((i.topic, i.partition) for i in items)]))
        except ServiceError as exc:
            refused.update({(i.topic, i.partition): exc for i in items})
            items = []
    outcomes: list[ProduceOutcome] = []
    if items:
        timeout_ms = max(int(request.timeout.total_seconds() * 1000), 0)
        outcomes = await ctx.broker.runtime.produce(
            items, timeout_ms=timeout_ms, transactional_id=transactional_id)
    # The first outcome of each partition decides its answer: its error, or
    # the offset of its first batch.
    results: dict[tuple[str, int], tuple[int, int, int, str | None]] = {}
    for outcome in outcomes:
        key = (outcome.topic, outcome.partition)
        code = ctx.code(outcome.error)
        if key not in results or (code and not results[key][0]):
            message = outcome.error.message if outcome.error is not None else None
            results[key] = (code, outcome.base_offset if not code else -1,
                            outcome.log_start_offset, message)
    for key, error in refused.items():
        results[key] = (ctx.code(error), -1, -1, error.message)
    throttle_ms = 0 if quotas is None else quotas.produced(
        principal, client_id,
        sum(len(part.records or b"") for t in request.topic_data for part in t.partition_data))
    if acks == 0:
        failed = [key for key, result in results.items() if result[0]]
        if failed:
            raise CloseConnection(f"a Produce with acks=0 failed on {failed[0][0]}-"
                                  f"{failed[0][1]}: {results[failed[0]][3]}")
        return None
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), (code, base_offset, log_start, message) in results.items():
        by_topic.setdefault(topic, []).append(builder.make(
            "PartitionProduceResponse", index=partition, error_code=code,
            base_offset=base_offset, log_append_time=-1, log_start_offset=log_start,
            record_errors=(), error_message=message))
    return builder.response(
        responses=tuple(builder.make("TopicProduceResponse", name=topic,
                                     partition_responses=tuple(parts))
                        for topic, parts in by_topic.items()),
        throttle_time=throttle_ms)
