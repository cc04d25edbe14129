"""The gRPC links to the transaction coordinators: the TxnVerifier and the
TxnResolver.

GrpcTxnVerifier asks the transaction coordinator that owns a
transactional id (AddPartitionsToTxn with verify_only) whether partitions are
in a producer's ongoing transaction, or adds them on the producer's behalf.
The questions go over one AddPartitionsToTxnStream per coordinator
(services/common/rpc/stream_client.py): each transaction's first write waits for
its answer.

Placement comes from the shared ClusterLayout: the coordinator node of
`layout.transaction_state_partition(transactional_id)`, or, when a
coordinator runs in every store, the one in the store that leads that
partition now (`leader_of`, this store's view; ClusterLayout.coordinator_now).
A coordinator that
cannot be reached, or answers with a request-level error, makes every
partition of the question fail with a retriable code (COORDINATOR_NOT_AVAILABLE
for transport failures; the coordinator's own code, such as NOT_COORDINATOR or
COORDINATOR_LOAD_IN_PROGRESS, otherwise), so the producer retries its batch.

GrpcTxnResolver asks every coordinator of the layout about a transaction
the store has held open past its timeout (ResolveTransaction, unary: rare),
and keeps the answers of the `__transaction_state` partitions each one owns
(by the layout, or by leadership as above); whatever does not answer is left
out (transactions/resolver.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from oncelog.v1 import coordinator_pb2, coordinator_pb2_grpc, records_pb2
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...common.kernel.txn_fate import TxnFate
from ...common.metadata.cluster import ClusterLayout, LeaderOf
from ...common.rpc.channels import ChannelPool
from ...common.rpc.local_calls import InProcess
from ...common.rpc.stream_client import StreamMethod
from ..core.outcomes import Rejection
from ..transactions.resolver import Answers, CoordinatorAnswer, HangingQuestion
from ..transactions.verifier import TopicPartitionKey, VerifyAnswer

log = logging.getLogger("oncelog.partition_store")

# A coordinator's answer may wait for a confirmation of its ownership (a
# store round trip), an append (its timeout path) and a marker sent to the
# asking store: more than a verification.
RESOLVE_TIMEOUT_S = 20.0
ADD_PARTITIONS_TO_TXN_STREAM = "/oncelog.v1.TransactionCoordinator/AddPartitionsToTxnStream"

# Transport failures: the coordinator may be restarting or moving; retry.
_TRANSPORT_CODES = {ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT}


async def no_leader(_topic: str, _partition: int) -> int:
    """Until the store's runtime is wired (server.wire sets `leader_of`)."""
    return -1


class GrpcTxnVerifier:
    def __init__(self, layout: ClusterLayout, *, timeout_ms: int = 5_000,
                 local: InProcess | None = None, leader_of: LeaderOf = no_leader) -> None:
        self._layout = layout
        self.leader_of = leader_of
        self._timeout_s = timeout_ms / 1000
        self._channels = ChannelPool()
        # `local`: the coordinator this process runs, if any, is asked without gRPC.
        self._questions: StreamMethod[coordinator_pb2.AddPartitionsToTxnRequest,
                                      coordinator_pb2.AddPartitionsToTxnResponse] = StreamMethod(
            ADD_PARTITIONS_TO_TXN_STREAM,
            "/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn",
            coordinator_pb2.AddPartitionsToTxnResponse, local=local)

    async def verify(
        self, *, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey], add: bool = False,
    ) -> VerifyAnswer:
        layout = self._layout
        if not layout.coordinators:
            raise ServiceError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "the cluster layout names no transaction coordinator (--coordinators), so "
                f"transactional id {transactional_id!r} cannot be verified",
            )
        node = await layout.coordinator_now(
            layout.transaction_state_partition(transactional_id), self.leader_of)
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
        return VerifyAnswer(verdicts, response.transaction_timeout_ms)

    async def close(self) -> None:
        self._questions.close()
        await self._channels.close()


class GrpcTxnResolver:
    def __init__(self, layout: ClusterLayout, *, timeout_s: float = RESOLVE_TIMEOUT_S,
                 leader_of: LeaderOf = no_leader) -> None:
        self._layout = layout
        self.leader_of = leader_of
        self._timeout_s = timeout_s
        self._channels = ChannelPool()

    async def resolve(self, question: HangingQuestion) -> Answers:
        request = coordinator_pb2.ResolveTransactionRequest(
            producer_id=question.producer_id, producer_epoch=question.producer_epoch,
            partition=records_pb2.TopicPartition(topic=question.topic,
                                                 partition=question.partition),
            last_marker_timestamp_ms=question.last_marker_timestamp_ms,
        )
        nodes = range(len(self._layout.coordinators))
        asked = await asyncio.gather(*(self._ask(node, request) for node in nodes))
        answers: dict[int, CoordinatorAnswer] = {}
        for node, response in zip(nodes, asked, strict=True):
            for result in response.results if response is not None else ():
                partition = result.transaction_state_partition
                # Only a partition that coordinator owns counts (by the
                # layout, or by leadership): an answer for another's
                # partition is not an answer for it.
                if result.error.code != 0 or not (
                        0 <= partition < self._layout.transaction_state_partitions):
                    continue
                try:
                    owner = await self._layout.coordinator_now(partition, self.leader_of)
                except ServiceError:
                    continue  # no owner now: no answer for it
                if owner != node:
                    continue
                try:
                    fate = TxnFate(result.fate)
                except ValueError:
                    continue  # a fate this store does not know: no answer
                answers[partition] = CoordinatorAnswer(
                    fate, result.transactional_id, result.transaction_timeout_ms)
        return answers

    async def _ask(self, node: int, request: coordinator_pb2.ResolveTransactionRequest,
                   ) -> coordinator_pb2.ResolveTransactionResponse | None:
        address = self._layout.coordinators[node]
        stub = coordinator_pb2_grpc.TransactionCoordinatorStub(self._channels.get(address))
        try:
            response: coordinator_pb2.ResolveTransactionResponse = (
                await stub.ResolveTransaction(request, timeout=self._timeout_s))
        except grpc.aio.AioRpcError as exc:
            log.info("transaction coordinator %d at %s did not answer about producer %d "
                     "(epoch %d) on %s-%d: %s %s", node, address, request.producer_id,
                     request.producer_epoch, request.partition.topic,
                     request.partition.partition, exc.code().name, exc.details())
            return None
        return response

    async def close(self) -> None:
        await self._channels.close()
