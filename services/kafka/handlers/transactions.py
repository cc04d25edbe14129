"""The transaction APIs: InitProducerId (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26), and the admin ones DescribeProducers
(61), DescribeTransactions (65), ListTransactions (66).

The coordinator APIs go to the transaction coordinator that owns the
transactional id, over gRPC (rpc/forward.py), after the listener authorized the
client with the rule of the same gRPC method. Kafka's clients run
transaction version 1 (their EndTxn does not move the producer epoch):
InitProducerId says so to the coordinator, which keeps the epoch across
their transactions and sends markers at it (docs/coordinator.md,
"Transaction versions"). DescribeProducers is the store's own (it holds the
producer state of its partitions).
"""

from __future__ import annotations

from typing import Any

from oncelog.v1 import coordinator_pb2 as cpb
from oncelog.v1 import partition_store_pb2 as pb
from oncelog.v1 import records_pb2
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import TRANSACTION_STATES

from ...common.kernel.errors import ServiceError
from ..context import RequestContext
from ..rpc.forward import TRANSACTION_COORDINATOR

_TC = "/oncelog.v1.TransactionCoordinator/"
_PS = "/oncelog.v1.PartitionStore/"


def _code(error: Any) -> ErrorCode | None:
    return None if error.code == 0 else ErrorCode.from_wire(error.code)


# ------------------------------------------------------------- InitProducerId

# Kafka's clients speak transaction version 1 (docs/coordinator.md,
# "Transaction versions"): their EndTxn keeps the producer epoch.
TRANSACTION_VERSION_1 = 1
# InitProducerId v3 carries the caller's producer id and epoch (KIP-360).
KIP_360_SINCE = 3


async def init_producer_id(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    transactional_id = request.transactional_id or ""
    timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
    proto = cpb.InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
        transaction_version=TRANSACTION_VERSION_1)
    if ctx.version >= KIP_360_SINCE:
        # The producer's current ids: it recovers from an abortable error by
        # bumping its own epoch (KIP-360); -1/-1 is a fresh start.
        proto.producer_id = int(request.producer_id)
        proto.producer_epoch = int(request.producer_epoch)
    try:
        ctx.authorize(_TC + "InitProducerId", proto)
        # An idempotent producer's id may come from any coordinator: each
        # allocates from the cluster's shared blocks (__producer_ids).
        key = transactional_id or (ctx.header.client_id or "")
        response = await ctx.broker.coordinators.transaction(
            key, "InitProducerId", proto, cpb.InitProducerIdResponse)
    except ServiceError as exc:
        return builder.response(throttle_time=0, error_code=ctx.code(exc), producer_id=-1,
                                producer_epoch=-1)
    return builder.response(throttle_time=0, error_code=ctx.code(_code(response.error)),
                            producer_id=response.producer_id,
                            producer_epoch=response.producer_epoch)


# ---------------------------------------------------------- AddPartitionsToTxn


async def add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    transactional_id = request.v3_and_below_transactional_id
    wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    proto = cpb.AddPartitionsToTxnRequest(
        transactional_id=transactional_id,
        producer_id=int(request.v3_and_below_producer_id),
        producer_epoch=int(request.v3_and_below_producer_epoch),
        partitions=[records_pb2.TopicPartition(topic=t, partition=p) for t, p in wanted])
    codes: dict[tuple[str, int], int] = {}
    try:
        ctx.authorize(_TC + "AddPartitionsToTxn", proto)
        response = await ctx.broker.coordinators.transaction(
            transactional_id, "AddPartitionsToTxn", proto, cpb.AddPartitionsToTxnResponse)
        for result in response.results:
            codes[(result.partition.topic, result.partition.partition)] = ctx.code(
                _code(result.error))
    except ServiceError as exc:
        codes = {tp: ctx.code(exc) for tp in wanted}
    by_topic: dict[str, list[Any]] = {}
    for topic, partition in wanted:
        by_topic.setdefault(topic, []).append(builder.make(
            "AddPartitionsToTxnPartitionResult", partition_index=partition,
            partition_error_code=codes.get((topic, partition),
                                           int(ErrorCode.UNKNOWN_SERVER_ERROR))))
    return builder.response(throttle_time=0, results_by_topic_v3_and_below=tuple(
        builder.make("AddPartitionsToTxnTopicResult", name=topic, results_by_partition=tuple(r))
        for topic, r in by_topic.items()))


# ------------------------------------------------------------- AddOffsetsToTxn


async def add_offsets_to_txn(ctx: RequestContext, request: Any) -> Any:
    proto = cpb.AddOffsetsToTxnRequest(
        transactional_id=request.transactional_id, producer_id=int(request.producer_id),
        producer_epoch=int(request.producer_epoch), group_id=request.group_id)
    try:
        ctx.authorize(_TC + "AddOffsetsToTxn", proto)
        response = await ctx.broker.coordinators.transaction(
            request.transactional_id, "AddOffsetsToTxn", proto, cpb.AddOffsetsToTxnResponse)
        code = ctx.code(_code(response.error))
    except ServiceError as exc:
        code = ctx.code(exc)
    return ctx.builder().response(throttle_time=0, error_code=code)


# ----------------------------------------------------------------------- EndTxn


async def end_txn(ctx: RequestContext, request: Any) -> Any:
    proto = cpb.EndTxnRequest(
        transactional_id=request.transactional_id, producer_id=int(request.producer_id),
        producer_epoch=int(request.producer_epoch), commit=bool(request.committed))
    try:
        ctx.authorize(_TC + "EndTxn", proto)
        response = await ctx.broker.coordinators.transaction(
            request.transactional_id, "EndTxn", proto, cpb.EndTxnResponse)
        code = ctx.code(_code(response.error))
    except ServiceError as exc:
        code = ctx.code(exc)
    return ctx.builder().response(throttle_time=0, error_code=code)


# ------------------------------------------------------------ DescribeProducers


async def describe_producers(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    wanted = [(t.name, int(p)) for t in request.topics for p in t.partition_indexes]
    by_topic: dict[str, list[Any]] = {}
    try:
        ctx.authorize(_PS + "DescribeProducers", pb.DescribeProducersRequest(partitions=[
            records_pb2.TopicPartition(topic=t, partition=p) for t, p in wanted]))
        outcomes = await ctx.broker.runtime.describe_producers(wanted)
        for o in outcomes:
            by_topic.setdefault(o.topic, []).append(builder.make(
                "PartitionResponse", partition_index=o.partition, error_code=ctx.code(o.error),
                error_message=o.error.message if o.error is not None else None,
                active_producers=tuple(builder.make(
                    "ProducerState", producer_id=e.producer_id, producer_epoch=e.producer_epoch,
                    last_sequence=e.last_sequence, last_timestamp=e.last_timestamp_ms,
                    coordinator_epoch=e.coordinator_epoch,
                    current_txn_start_offset=e.current_txn_first_offset)
                    for e in o.producers)))
    except ServiceError as exc:
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(builder.make(
                "PartitionResponse", partition_index=partition, error_code=ctx.code(exc),
                error_message=exc.message, active_producers=()))
    return builder.response(throttle_time=0, topics=tuple(
        builder.make("TopicResponse", name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))


# --------------------------------------------------------- DescribeTransactions


async def describe_transactions(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    states = []
    coordinators = ctx.broker.coordinators
    for transactional_id in request.transactional_ids:
        proto = cpb.DescribeTransactionsRequest(transactional_ids=[transactional_id])
        try:
            authorizer = ctx.authorize(_TC + "DescribeTransactions", proto)
            response = await coordinators.transaction(
                transactional_id, "DescribeTransactions", proto,
                cpb.DescribeTransactionsResponse)
            ctx.filter_answer(_TC + "DescribeTransactions", proto, response, authorizer)
        except ServiceError as exc:
            states.append(builder.make(
                "TransactionState", error_code=ctx.code(exc), transactional_id=transactional_id,
                transaction_state="", transaction_timeout=0, transaction_start_time=-1,
                producer_id=-1, producer_epoch=-1, topics=()))
            continue
        for d in response.transactions:
            topics: dict[str, list[int]] = {}
            for tp in d.partitions:
                topics.setdefault(tp.topic, []).append(tp.partition)
            states.append(builder.make(
                "TransactionState", error_code=ctx.code(_code(d.error)),
                transactional_id=d.transactional_id, transaction_state=d.state,
                transaction_timeout=d.transaction_timeout_ms,
                transaction_start_time=d.transaction_start_time_ms if d.transaction_start_time_ms
                > 0 else -1,
                producer_id=d.producer_id, producer_epoch=d.producer_epoch,
                topics=tuple(builder.make("TopicData", topic=t, partitions=tuple(ps))
                             for t, ps in topics.items())))
    return builder.response(throttle_time=0, transaction_states=tuple(states))


# ------------------------------------------------------------- ListTransactions


async def list_transactions(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    states = list(request.state_filters)
    proto = cpb.ListTransactionsRequest(states=states,
                                        states_enum=TRANSACTION_STATES.numbers_of(states),
                                        producer_ids=list(request.producer_id_filters))
    try:
        authorizer = ctx.authorize(_TC + "ListTransactions", proto)
        responses = await ctx.broker.coordinators.each(
            ctx.broker.coordinators.transaction_coordinators, TRANSACTION_COORDINATOR,
            "ListTransactions", proto, cpb.ListTransactionsResponse)
    except ServiceError as exc:
        return builder.response(throttle_time=0, error_code=ctx.code(exc),
                                unknown_state_filters=(), transaction_states=())
    listing = cpb.ListTransactionsResponse()
    for response in responses:
        listing.transactions.extend(response.transactions)
    ctx.filter_answer(_TC + "ListTransactions", proto, listing, authorizer)
    return builder.response(
        throttle_time=0, error_code=0, unknown_state_filters=(),
        transaction_states=tuple(builder.make(
            "TransactionState", transactional_id=t.transactional_id, producer_id=t.producer_id,
            transaction_state=t.state) for t in listing.transactions))
