"""FindCoordinator (10): which broker takes a group's or a transactional
id's coordinator requests.

Every store forwards coordinator requests to the coordinator that owns the
key (rpc/forward.py), so any store could answer; the one named is the store
that leads the key's partition of `__consumer_offsets` (groups) or
`__transaction_state` (transactional ids), as in Kafka, which spreads the
coordinators' clients over the stores. When that partition has no leader
right now the answer is COORDINATOR_NOT_AVAILABLE, and the client asks
again.
"""

from __future__ import annotations

from typing import Any

from oncelog.v1 import coordinator_pb2 as cpb
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...common.metadata.cluster import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from ..context import RequestContext

FIND_COORDINATOR_METHOD = "/oncelog.v1.TransactionCoordinator/FindCoordinator"
GROUP_KEY = 0
TRANSACTION_KEY = 1


def _locate(ctx: RequestContext, key: str, key_type: int) -> tuple[int, str, int]:
    """(node id, host, port) of the store to send the key's requests to."""
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        raise ServiceError(ErrorCode.INVALID_REQUEST,
                           f"key type {key_type}: 0 (group) or 1 (transaction)")
    proto = cpb.FindCoordinatorRequest(
        key=key, type=cpb.GROUP if key_type == GROUP_KEY else cpb.TRANSACTION)
    ctx.authorize(FIND_COORDINATOR_METHOD, proto)
    broker = ctx.broker
    layout = broker.runtime.layout
    if key_type == GROUP_KEY:
        if not layout.group_coordinators:
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               "the cluster has no group coordinator")
        topic, partition = CONSUMER_OFFSETS_TOPIC, layout.consumer_offsets_partition(key)
    else:
        if not layout.coordinators:
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               "the cluster has no transaction coordinator")
        topic, partition = TRANSACTION_STATE_TOPIC, layout.transaction_state_partition(key)
    leader = broker.runtime.partition_state(topic, partition).leader
    brokers = {node_id: (node_id, host, port) for node_id, host, port in broker.brokers()}
    if leader in brokers:
        return brokers[leader]
    if leader < 0:
        raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                           f"{topic}-{partition} has no leader right now; retry")
    # The leader has no Kafka listener known here: this store forwards too.
    return brokers[broker.node_id]


async def handle(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    key_type = int(getattr(request, "key_type", GROUP_KEY))
    if ctx.version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            try:
                node_id, host, port = _locate(ctx, key, key_type)
                coordinators.append(builder.make(
                    "Coordinator", key=key, node_id=node_id, host=host, port=port,
                    error_code=0, error_message=None))
            except ServiceError as exc:
                coordinators.append(builder.make(
                    "Coordinator", key=key, node_id=-1, host="", port=-1,
                    error_code=ctx.code(exc), error_message=exc.message))
        return builder.response(throttle_time=0, coordinators=tuple(coordinators))
    try:
        node_id, host, port = _locate(ctx, request.key, key_type)
    except ServiceError as exc:
        return builder.response(throttle_time=0, error_code=ctx.code(exc),
                                error_message=exc.message, node_id=-1, host="", port=-1)
    return builder.response(throttle_time=0, error_code=0, error_message=None, node_id=node_id,
                            host=host, port=port)
