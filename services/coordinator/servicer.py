"""gRPC servicer of the transaction coordinator: proto -> call -> proto/status."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from oncelog.errors import ErrorCode
from oncelog.v1 import coordinator_pb2 as pb
from oncelog.v1 import coordinator_pb2_grpc as pb_grpc
from services.common.cluster import ClusterLayout
from services.common.errors import ServiceError, abort_with
from services.coordinator.runtime import ProducerIdManager


class TransactionCoordinatorServicer(pb_grpc.TransactionCoordinatorServicer):
    def __init__(self, *, layout: ClusterLayout, producer_ids: ProducerIdManager) -> None:
        self._layout = layout
        self._producer_ids = producer_ids

    async def FindCoordinator(  # noqa: N802 - gRPC method name
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        if not request.key:
            await abort_with(
                context, ServiceError(ErrorCode.INVALID_REQUEST, "FindCoordinator needs a key")
            )
        if request.type == pb.TRANSACTION:
            if not self._layout.coordinators:
                await abort_with(context, ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "the cluster has no transaction coordinator",
                ))
            partition = self._layout.transaction_state_partition(request.key)
            node_id = self._layout.coordinator_for_partition(partition)
            address = self._layout.coordinators[node_id]
        else:
            if not self._layout.group_coordinators:
                await abort_with(context, ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE, "the cluster has no group coordinator"
                ))
            partition = self._layout.consumer_offsets_partition(request.key)
            node_id = self._layout.group_coordinator_for_partition(partition)
            address = self._layout.group_coordinators[node_id]
        return pb.FindCoordinatorResponse(node_id=node_id, address=address, partition=partition)

    async def InitProducerId(  # noqa: N802 - gRPC method name
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        if request.transactional_id:
            await abort_with(context, ServiceError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"transactional id {request.transactional_id!r}: transactions are not "
                "available in this version of the coordinator",
            ))
        try:
            producer_id = await self._producer_ids.next_producer_id()
        except ServiceError as exc:
            if exc.code.retriable or exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                # The store is away or still creating internal topics: the client retries.
                exc = ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE, exc.message)
            await abort_with(context, exc)
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)

    # Transactions proper (the state machine, markers, admin) are not in this
    # version; these answer with a clear error instead of gRPC's bare UNIMPLEMENTED.
    async def _transactions_unavailable(self, context: grpc.aio.ServicerContext) -> NoReturn:
        await abort_with(context, ServiceError(
            ErrorCode.UNSUPPORTED_VERSION,
            "transactions are not available in this version of the coordinator",
        ))

    async def AddPartitionsToTxn(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._transactions_unavailable(context)

    async def AddOffsetsToTxn(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._transactions_unavailable(context)

    async def EndTxn(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._transactions_unavailable(context)

    async def ListTransactions(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._transactions_unavailable(context)

    async def DescribeTransactions(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._transactions_unavailable(context)
