"""The gRPC TxnVerifier: asks the transaction coordinator that owns a
transactional id (AddPartitionsToTxn with verify_only) whether partitions are
in a producer's ongoing transaction, or adds them on the producer's behalf.
The questions go over one AddPartitionsToTxnStream per coordinator
(services/common/stream_client.py): each transaction's first write waits for
its answer.

Placement comes from the shared ClusterLayout: the coordinator node of
`layout.transaction_state_partition(transactional_id)`. A coordinator that
cannot be reached, or answers with a request-level error, makes every
partition of the question fail with a retriable code (COORDINATOR_NOT_AVAILABLE
for transport failures; the coordinator's own code, such as NOT_COORDINATOR or
COORDINATOR_LOAD_IN_PROGRESS, otherwise), so the producer retries its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from oncelog.v1 import coordinator_pb2, records_pb2
from oncelog.wire.errors import ErrorCode

from ..common.channels import ChannelPool
from ..common.cluster import ClusterLayout
from ..common.errors import ServiceError
from ..common.stream_client import StreamMethod
from .core.outcomes import Rejection
from .txn_verifier import TopicPartitionKey, Verdicts

# Transport failures: the coordinator may be restarting or moving; retry.
_TRANSPORT_CODES = {ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT}


class GrpcTxnVerifier:
    def __init__(self, layout: ClusterLayout, *, timeout_ms: int = 5_000) -> None:
        self._layout = layout
        self._timeout_s = timeout_ms / 1000
        self._channels = ChannelPool()
        self._questions: StreamMethod[coordinator_pb2.AddPartitionsToTxnRequest,
                                      coordinator_pb2.AddPartitionsToTxnResponse] = StreamMethod(
            "/oncelog.v1.TransactionCoordinator/AddPartitionsToTxnStream",
            "/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn",
            coordinator_pb2.AddPartitionsToTxnResponse)

    async def verify(
        self, *, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey], add: bool = False,
    ) -> Verdicts:
        layout = self._layout
        if not layout.coordinators:
            raise ServiceError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "the cluster layout names no transaction coordinator (--coordinators), so "
                f"transactional id {transactional_id!r} cannot be verified",
            )
        node = layout.coordinator_for_partition(
            layout.transaction_state_partition(transactional_id)
        )
        address = layout.coordinators[node]
        request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, verify_only=not add,
            partitions=[records_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions],
        )
        try:
            response = await self._questions.ask(
                address, self._channels.get(address), request, self._timeout_s)
        except ServiceError as exc:
            code = exc.code
            if code in _TRANSPORT_CODES:
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            raise ServiceError(
                code,
                f"transaction coordinator {node} at {address} did not verify "
                f"transactional id {transactional_id!r}: {exc.message}",
            ) from exc
        answered: dict[TopicPartitionKey, Rejection | None] = {}
        for result in response.results:
            key = (result.partition.topic, result.partition.partition)
            answered[key] = (
                None if result.error.code == 0
                else Rejection(ErrorCode.from_wire(result.error.code), result.error.message)
            )
        verdicts: dict[TopicPartitionKey, Rejection | None] = {}
        for tp in partitions:
            verdicts[tp] = answered.get(tp, Rejection(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"transaction coordinator {node} at {address} gave no answer for "
                f"{tp[0]}-{tp[1]}",
            ))
        return verdicts

    async def close(self) -> None:
        self._questions.close()
        await self._channels.close()
