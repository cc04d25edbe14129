"""gRPC servicer of the transaction coordinator: proto -> call -> proto/status."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from oncelog.v1 import coordinator_pb2 as pb
from oncelog.v1 import coordinator_pb2_grpc as pb_grpc
from oncelog.v1 import records_pb2
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import TRANSACTION_STATES, EnumPairError
from oncelog.wire.records import MAX_PRODUCER_EPOCH

from ...common.kernel import limits
from ...common.kernel.errors import ServiceError, check_id_length
from ...common.metadata.cluster import CONSUMER_OFFSETS_TOPIC, ClusterLayout, LeaderOf
from ...common.metadata.topic_counts import PartitionCounts
from ...common.rpc.local_calls import InProcess
from ...common.rpc.request_streams import Refused, answer_each
from ...common.security.guard import without_client_certificate
from ..core.hanging import NO_TIMESTAMP_MS, StoreQuestion
from ..core.transactions import (
    TxnMetadata,
    TxnState,
    parse_expected_producer,
    parse_transaction_version,
)
from ..producer_id_manager import ProducerIdManager
from ..txn_runtime import TxnCoordinatorRuntime

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TransactionCoordinator"].full_name


def _tp(p: records_pb2.TopicPartition) -> tuple[str, int]:
    return p.topic, p.partition


def _require_transactional_id(rpc: str, transactional_id: str) -> None:
    # Kafka's INVALID_REQUEST: "" is no transactional id at all, not an
    # unknown one.
    if not transactional_id:
        raise ServiceError(ErrorCode.INVALID_REQUEST, f"{rpc} needs a transactional_id")


def _store_question(request: pb.ResolveTransactionRequest) -> StoreQuestion:
    topic, partition = _tp(request.partition)
    if request.producer_id < 0 or not 0 <= request.producer_epoch <= MAX_PRODUCER_EPOCH:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"ResolveTransaction needs a producer id >= 0 and an epoch in "
            f"0..{MAX_PRODUCER_EPOCH}, received {request.producer_id} and "
            f"{request.producer_epoch}")
    if not topic or len(topic) > limits.MAX_TOPIC_NAME_LENGTH or partition < 0:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"ResolveTransaction needs the partition that holds the transaction open, "
            f"received topic {topic[:32]!r} partition {partition}")
    return StoreQuestion(
        producer_id=request.producer_id, producer_epoch=request.producer_epoch,
        topic_partition=(topic, partition),
        last_marker_timestamp_ms=max(request.last_marker_timestamp_ms, NO_TIMESTAMP_MS),
    )


def _prepared(state: tuple[int, int] | None) -> pb.PreparedTxnState | None:
    if state is None:
        return None
    return pb.PreparedTxnState(producer_id=state[0], producer_epoch=state[1])


def _describe(md: TxnMetadata, coordinator_epoch: int) -> pb.TransactionDescription:
    return pb.TransactionDescription(
        transactional_id=md.transactional_id,
        state=md.state.value,
        state_enum=TRANSACTION_STATES.number(md.state.value),
        producer_id=md.producer_id,
        producer_epoch=md.producer_epoch,
        transaction_timeout_ms=md.transaction_timeout_ms,
        transaction_start_time_ms=md.txn_start_ms,
        partitions=[records_pb2.TopicPartition(topic=t, partition=p)
                    for t, p in sorted(md.partitions)],
        coordinator_epoch=coordinator_epoch,
        two_phase_commit=md.two_phase_commit,
        prepared_transaction=_prepared(
            md.prepared_state if md.state is TxnState.PREPARED else None
        ),
        transaction_version=int(md.transaction_version),
    )


class TransactionCoordinatorServicer(pb_grpc.TransactionCoordinatorServicer):
    """Request-level failures travel as a gRPC status carrying our Error; the
    responses' own `error` fields are left NONE, except in a stream, where a
    request that fails as a whole is answered with it (the *Stream methods).
    Per-partition failures (of AddPartitionsToTxn) are in the per-partition
    results."""

    def __init__(self, *, layout: ClusterLayout, producer_ids: ProducerIdManager,
                 transactions: TxnCoordinatorRuntime, topics: PartitionCounts,
                 leader_of: LeaderOf) -> None:
        """`leader_of`: who leads a partition now, for FindCoordinator's
        answer where coordinators follow leadership (ClusterLayout)."""
        self._layout = layout
        self._leader_of = leader_of
        self._producer_ids = producer_ids
        self._txns = transactions
        self._topics = topics

    async def _check_partitions_exist(self, partitions: list[tuple[str, int]]) -> None:
        """Refuses partitions of topics that do not exist, as Kafka does: the
        transaction would hold a partition no marker can reach. Answered
        from the cache (the partitions a store adds on a producer's behalf
        exist); a miss is read again, since the topic may be new."""
        def missing(counts: dict[str, int]) -> list[tuple[str, int]]:
            return [(t, p) for t, p in partitions if p >= counts[t]]

        topics = {t for t, _p in partitions}
        absent = missing(await self._topics.get(topics))
        if absent:
            await self._topics.get({t for t, _p in absent}, refresh=True)
            absent = missing(await self._topics.get(topics))
        if absent:
            named = ", ".join(f"{t}-{p}" for t, p in sorted(absent)[:10])
            more = f" and {len(absent) - 10} more" if len(absent) > 10 else ""
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"AddPartitionsToTxn names partitions that do not exist: {named}{more}; "
                "nothing was added",
            )

    async def FindCoordinator(  # noqa: N802 - gRPC method name
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        if not request.key:
            raise ServiceError(ErrorCode.INVALID_REQUEST, "FindCoordinator needs a key")
        if request.type not in (pb.TRANSACTION, pb.GROUP):
            # proto3 keeps an enum number it does not know; without this check
            # it would be answered as a group coordinator lookup.
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"FindCoordinator type {request.type} is unknown; expected "
                f"{pb.TRANSACTION} (TRANSACTION) or {pb.GROUP} (GROUP)",
            )
        if request.type == pb.TRANSACTION:
            if not self._layout.coordinators:
                raise ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "the cluster has no transaction coordinator",
                )
            partition = self._layout.transaction_state_partition(request.key)
            node_id = await self._layout.coordinator_now(partition, self._leader_of)
            address = self._layout.coordinator_addresses(
                token=without_client_certificate(context))[node_id]
        else:
            if not self._layout.group_coordinators:
                raise ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE, "the cluster has no group coordinator"
                )
            partition = self._layout.consumer_offsets_partition(request.key)
            node_id = await self._layout.group_coordinator_now(partition, self._leader_of)
            address = self._layout.group_coordinator_addresses(
                token=without_client_certificate(context))[node_id]
        return pb.FindCoordinatorResponse(node_id=node_id, address=address, partition=partition)

    def serve_in_process(self, local: InProcess) -> None:
        """Answers the calls of the store that runs this coordinator in its
        process (services/common/rpc/local_calls.py): its verification of
        transactional writes, and what its Kafka listener forwards."""
        for method, handler in (
            ("AddPartitionsToTxnStream", self._add_partitions_to_txn),
            ("AddPartitionsToTxn", self._add_partitions_to_txn),
            ("InitProducerId", self._init_producer_id),
            ("AddOffsetsToTxn", self._add_offsets_to_txn),
            ("EndTxn", self._end_txn),
        ):
            local.serve(f"/{SERVICE_NAME}/{method}", handler)

    async def InitProducerId(  # noqa: N802 - gRPC method name
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        return await self._init_producer_id(request)

    async def _init_producer_id(self, request: pb.InitProducerIdRequest,
                                ) -> pb.InitProducerIdResponse:
        if request.transactional_id:
            producer_id, producer_epoch, kept = await self._txns.init_producer_id(
                request.transactional_id, request.transaction_timeout_ms,
                two_phase_commit=request.enable_two_phase_commit,
                keep_prepared_txn=request.keep_prepared_txn,
                transaction_version=parse_transaction_version(
                    request.transaction_version),
                expected=parse_expected_producer(
                    request.producer_id if request.HasField("producer_id") else None,
                    request.producer_epoch if request.HasField("producer_epoch") else None,
                    transactional_id=request.transactional_id),
            )
            return pb.InitProducerIdResponse(producer_id=producer_id,
                                             producer_epoch=producer_epoch,
                                             prepared_transaction=_prepared(kept))
        if request.enable_two_phase_commit or request.keep_prepared_txn:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                "two-phase commit needs a transactional id",
            )
        try:
            producer_id = await self._producer_ids.next_producer_id()
        except ServiceError as exc:
            if exc.code.retriable or exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                # The store is away or still creating internal topics: the client retries.
                raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE, exc.message) from exc
            raise
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)


    async def AddPartitionsToTxn(  # noqa: N802 - gRPC method name
        self, request: pb.AddPartitionsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddPartitionsToTxnResponse:
        return await self._add_partitions_to_txn(request)

    async def AddPartitionsToTxnStream(  # noqa: N802 - gRPC method name
        self, requests: AsyncIterator[pb.AddPartitionsToTxnRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.AddPartitionsToTxnResponse]:
        async for answer in answer_each(requests, self._add_partitions_to_txn,
                                        pb.AddPartitionsToTxnResponse):
            yield answer

    async def _add_partitions_to_txn(
        self, request: pb.AddPartitionsToTxnRequest
    ) -> pb.AddPartitionsToTxnResponse:
        """AddPartitionsToTxn's work, for both its forms; raises ServiceError
        when the request fails as a whole."""
        partitions = [_tp(p) for p in request.partitions]
        if not request.transactional_id or not partitions:
            raise ServiceError(ErrorCode.INVALID_REQUEST,
                               "AddPartitionsToTxn needs a transactional id and partitions")
        for topic, partition in partitions:
            if not topic:
                raise ServiceError(ErrorCode.INVALID_REQUEST,
                                   f"partition {partition} names no topic (empty topic name)")
            if len(topic) > limits.MAX_TOPIC_NAME_LENGTH:
                # No such topic can exist; and naming it whole would not
                # fit in the status (see limits.MAX_ID_LENGTH).
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic name {topic[:32]!r}... is {len(topic)} characters long, over "
                    f"the limit of {limits.MAX_TOPIC_NAME_LENGTH}",
                )
            if partition < 0:
                raise ServiceError(ErrorCode.INVALID_REQUEST,
                                   f"partition {partition} of topic {topic!r} is negative")
        if request.verify_only:
            verdicts = await self._txns.verify_partitions(
                request.transactional_id, request.producer_id, request.producer_epoch,
                partitions,
            )
            return pb.AddPartitionsToTxnResponse(request_id=request.request_id, results=[
                pb.AddPartitionsToTxnResult(
                    partition=records_pb2.TopicPartition(topic=t, partition=p),
                    error=err.to_proto() if err else None,
                )
                for (t, p), err in verdicts.items()
            ], transaction_timeout_ms=self._txns.transaction_timeout_ms(request.transactional_id))
        await self._check_partitions_exist(partitions)
        await self._txns.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch,
            frozenset(partitions),
        )
        return pb.AddPartitionsToTxnResponse(request_id=request.request_id, results=[
            pb.AddPartitionsToTxnResult(partition=p) for p in request.partitions
        ], transaction_timeout_ms=self._txns.transaction_timeout_ms(request.transactional_id))

    async def AddOffsetsToTxn(  # noqa: N802 - gRPC method name
        self, request: pb.AddOffsetsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddOffsetsToTxnResponse:
        return await self._add_offsets_to_txn(request)

    async def _add_offsets_to_txn(self, request: pb.AddOffsetsToTxnRequest,
                                  ) -> pb.AddOffsetsToTxnResponse:
        _require_transactional_id("AddOffsetsToTxn", request.transactional_id)
        if not request.group_id:
            raise ServiceError(ErrorCode.INVALID_GROUP_ID, "AddOffsetsToTxn needs a group id")
        # The group coordinator refuses such a group id for every request.
        check_id_length("group_id", request.group_id, ErrorCode.INVALID_GROUP_ID)
        # The group's __consumer_offsets partition joins the transaction, so
        # it gets the marker that makes the group's pending offsets visible.
        partition = self._layout.consumer_offsets_partition(request.group_id)
        await self._txns.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch,
            frozenset({(CONSUMER_OFFSETS_TOPIC, partition)}),
        )
        return pb.AddOffsetsToTxnResponse()

    async def EndTxn(  # noqa: N802 - gRPC method name
        self, request: pb.EndTxnRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndTxnResponse:
        return await self._end_txn(request)

    async def EndTxnStream(  # noqa: N802 - gRPC method name
        self, requests: AsyncIterator[pb.EndTxnRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.EndTxnResponse]:
        async for answer in answer_each(requests, self._end_txn, pb.EndTxnResponse):
            yield answer

    async def _end_txn(self, request: pb.EndTxnRequest) -> pb.EndTxnResponse:
        """EndTxn's work, for both its forms; raises ServiceError when the
        request fails."""
        _require_transactional_id("EndTxn", request.transactional_id)
        producer_id, producer_epoch = await self._txns.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch,
            request.commit,
        )
        return pb.EndTxnResponse(request_id=request.request_id, producer_id=producer_id,
                                 producer_epoch=producer_epoch)

    async def PrepareTransaction(  # noqa: N802 - gRPC method name
        self, request: pb.PrepareTransactionRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrepareTransactionResponse:
        if not request.transactional_id:
            raise ServiceError(ErrorCode.INVALID_REQUEST,
                               "PrepareTransaction needs a transactional id")
        prepared = await self._txns.prepare(
            request.transactional_id, request.producer_id, request.producer_epoch,
        )
        return pb.PrepareTransactionResponse(prepared_transaction=_prepared(prepared))

    async def CompleteTransaction(  # noqa: N802 - gRPC method name
        self, request: pb.CompleteTransactionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteTransactionResponse:
        if not request.transactional_id or not request.HasField("prepared_transaction"):
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                "CompleteTransaction needs a transactional id and a prepared state",
            )
        given = request.prepared_transaction
        committed, producer_id, producer_epoch = await self._txns.complete_prepared(
            request.transactional_id, request.producer_id, request.producer_epoch,
            (given.producer_id, given.producer_epoch),
        )
        return pb.CompleteTransactionResponse(committed=committed, producer_id=producer_id,
                                              producer_epoch=producer_epoch)

    async def ListTransactions(  # noqa: N802 - gRPC method name
        self, request: pb.ListTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTransactionsResponse:
        try:
            # The states as the strings or the enums name them (Kafka's names
            # in any spelling); a state not known here matches nothing.
            states = TRANSACTION_STATES.request_filter(
                "states", list(request.states_enum), list(request.states))
        except EnumPairError as exc:
            raise ServiceError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
        wanted = None if states is None else {state.value for state in states}
        producer_ids = set(request.producer_ids)
        return pb.ListTransactionsResponse(transactions=[
            pb.TransactionListing(transactional_id=md.transactional_id,
                                  producer_id=md.producer_id, state=md.state.value,
                                  state_enum=TRANSACTION_STATES.number(md.state.value))
            for md in sorted(self._txns.list_transactions(), key=lambda m: m.transactional_id)
            if (wanted is None or md.state.value in wanted)
            and (not producer_ids or md.producer_id in producer_ids)
        ])

    async def DescribeTransactions(  # noqa: N802 - gRPC method name
        self, request: pb.DescribeTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeTransactionsResponse:
        out = []
        for transactional_id in request.transactional_ids:
            try:
                md, coordinator_epoch = self._txns.describe(transactional_id)
                if md is None:
                    raise ServiceError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                                       f"transactional id {transactional_id!r} is not known")
                out.append(_describe(md, coordinator_epoch))
            except ServiceError as exc:
                out.append(pb.TransactionDescription(transactional_id=transactional_id,
                                                     error=exc.to_proto()))
        return pb.DescribeTransactionsResponse(transactions=out)

    async def ResolveTransaction(  # noqa: N802 - gRPC method name
        self, request: pb.ResolveTransactionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveTransactionResponse:
        question = _store_question(request)
        answers = await self._txns.resolve_transaction(question)
        results = []
        for partition, found in sorted(answers.items()):
            if isinstance(found, ServiceError):
                results.append(pb.ResolvedTransaction(transaction_state_partition=partition,
                                                      error=found.to_proto()))
                continue
            results.append(pb.ResolvedTransaction(
                transaction_state_partition=partition, fate=int(found.fate),  # type: ignore[arg-type]
                transactional_id=found.transactional_id,
                transaction_timeout_ms=found.transaction_timeout_ms,
            ))
        return pb.ResolveTransactionResponse(results=results)

    async def AbortTransaction(  # noqa: N802 - gRPC method name
        self, request: pb.AbortTransactionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortTransactionResponse:
        _require_transactional_id("AbortTransaction", request.transactional_id)
        md = await self._txns.force_abort(request.transactional_id)
        _, coordinator_epoch = self._txns.describe(request.transactional_id)
        return pb.AbortTransactionResponse(transaction=_describe(md, coordinator_epoch))
