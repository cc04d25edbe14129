"""Metadata (3): the stores as brokers, and the topics.

Brokers are the stores with a Kafka listener, by node id; a partition's
leader, replicas and ISR are store node ids, as our own Metadata gives
them. Topic ids are our int64 topic ids as UUIDs (the low 64 bits).
Internal topics (`__transaction_state`, `__consumer_offsets`, ...) hold our
own records, not Kafka's: a listing of every topic leaves them out, and one
named explicitly is answered as internal (Kafka's clients skip internal
topics in pattern subscriptions). Topics are never created by Metadata
(Kafka's auto.create.topics.enable is off here): an unknown topic is
UNKNOWN_TOPIC_OR_PARTITION, and Admin clients create topics with
CreateTopics. The same authorization as our Metadata: a topic the caller
may not Describe is left out of a listing, and answered with
TOPIC_AUTHORIZATION_FAILED when named.
"""

from __future__ import annotations

import uuid
from typing import Any

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ..context import RequestContext

METADATA_METHOD = "/oncelog.v1.PartitionStore/Metadata"
# Kafka's value for "authorized operations were not asked for".
_OPERATIONS_NOT_ASKED = -(2**31)


def topic_uuid(topic_id: int) -> uuid.UUID:
    return uuid.UUID(int=topic_id & ((1 << 128) - 1))


async def handle(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    runtime = ctx.broker.runtime
    names: list[str] | None = None
    if request.topics is not None:
        names = [t.name for t in request.topics if t.name is not None]
    if names == [] and ctx.version >= 1 and request.topics is not None:
        lookups = []
    else:
        lookups = await runtime.metadata(names or [], include_internal=False)
    # The answer as our own Metadata would give it, filtered by the same rule.
    listing = pb.MetadataResponse()
    for lookup in lookups:
        if lookup.record is not None:
            listing.topics.add(name=lookup.name, topic_id=lookup.record.topic_id,
                               internal=lookup.record.internal)
        else:
            error = lookup.error or ServiceError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                                 f"topic {lookup.name!r} does not exist")
            listing.topics.add(name=lookup.name, error=error.to_proto())
    proto_request = pb.MetadataRequest(topics=names or [])
    authorizer = ctx.authorize(METADATA_METHOD, proto_request)
    ctx.filter_answer(METADATA_METHOD, proto_request, listing, authorizer)
    records = {lookup.name: lookup.record for lookup in lookups}
    topics = []
    for entry in listing.topics:
        record = records.get(entry.name) if entry.error.code == 0 else None
        if record is None:
            topics.append(builder.make(
                "MetadataResponseTopic", error_code=ctx.code(ErrorCode.from_wire(entry.error.code)),
                name=entry.name, topic_id=uuid.UUID(int=0), is_internal=False, partitions=(),
                topic_authorized_operations=_OPERATIONS_NOT_ASKED))
            continue
        partitions = []
        for p in range(record.partitions):
            state = runtime.partition_state(record.name, p)
            leader_available = state.leader >= 0
            partitions.append(builder.make(
                "MetadataResponsePartition",
                error_code=0 if leader_available else ctx.code(ErrorCode.LEADER_NOT_AVAILABLE),
                partition_index=p, leader_id=state.leader, leader_epoch=state.leader_epoch,
                replica_nodes=tuple(state.replicas), isr_nodes=tuple(state.isr),
                offline_replicas=()))
        topics.append(builder.make(
            "MetadataResponseTopic", error_code=0, name=record.name,
            topic_id=topic_uuid(record.topic_id), is_internal=record.internal,
            partitions=tuple(partitions), topic_authorized_operations=_OPERATIONS_NOT_ASKED))
    brokers = tuple(builder.make("MetadataResponseBroker", node_id=node_id, host=host, port=port,
                                 rack=None)
                    for node_id, host, port in ctx.broker.brokers())
    return builder.response(
        throttle_time=0, brokers=brokers, cluster_id=ctx.broker.cluster_id,
        controller_id=runtime.catalog_node_id, topics=tuple(topics),
        cluster_authorized_operations=_OPERATIONS_NOT_ASKED)
