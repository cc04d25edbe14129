"""gRPC servicer of the group coordinator: proto -> call -> proto/status.

Request-level failures travel as a gRPC status carrying our Error (as in the
other services); the responses' own `error` fields are left NONE, except
OffsetFetch's per-partition UNSTABLE_OFFSET_COMMIT and DescribeGroups' and
DeleteGroups' per-group results.
"""

from __future__ import annotations

import grpc

from oncelog.v1 import group_coordinator_pb2 as pb
from oncelog.v1 import group_coordinator_pb2_grpc as pb_grpc
from oncelog.v1 import records_pb2

from ..common.errors import ServiceError, abort_with
from .runtime import TP, GroupCoordinatorRuntime


def _tp(p: records_pb2.TopicPartition) -> TP:
    return p.topic, p.partition


def _tp_proto(tp: TP) -> records_pb2.TopicPartition:
    return records_pb2.TopicPartition(topic=tp[0], partition=tp[1])


def _commit_partitions(parts: list[pb.OffsetCommitPartition]) -> list[tuple[TP, int, str]]:
    return [((p.topic, p.partition), p.offset, p.metadata) for p in parts]


def _results(parts: list[pb.OffsetCommitPartition]) -> list[pb.OffsetPartitionResult]:
    return [pb.OffsetPartitionResult(topic=p.topic, partition=p.partition) for p in parts]


class GroupCoordinatorServicer(pb_grpc.GroupCoordinatorServicer):
    def __init__(self, runtime: GroupCoordinatorRuntime) -> None:
        self._rt = runtime

    async def ConsumerGroupHeartbeat(  # noqa: N802 - gRPC method name
        self, request: pb.ConsumerGroupHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConsumerGroupHeartbeatResponse:
        try:
            answer = await self._rt.heartbeat(
                group_id=request.group_id, member_id=request.member_id,
                member_epoch=request.member_epoch, instance_id=request.group_instance_id,
                topics=list(request.subscribed_topics),
                session_timeout_ms=request.session_timeout_ms,
                owned_partitions=[_tp(p) for p in request.owned_partitions],
            )
        except ServiceError as exc:
            await abort_with(context, exc)
        return pb.ConsumerGroupHeartbeatResponse(
            member_id=answer.member_id, member_epoch=answer.member_epoch,
            heartbeat_interval_ms=answer.heartbeat_interval_ms, has_assignment=True,
            assignment=[_tp_proto(tp) for tp in sorted(answer.assignment)],
        )

    async def OffsetCommit(  # noqa: N802 - gRPC method name
        self, request: pb.OffsetCommitRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetCommitResponse:
        try:
            await self._rt.commit_offsets(
                group_id=request.group_id, member_id=request.member_id,
                generation_id=request.generation_id,
                partitions=_commit_partitions(list(request.partitions)),
            )
        except ServiceError as exc:
            await abort_with(context, exc)
        return pb.OffsetCommitResponse(results=_results(list(request.partitions)))

    async def TxnOffsetCommit(  # noqa: N802 - gRPC method name
        self, request: pb.TxnOffsetCommitRequest, context: grpc.aio.ServicerContext
    ) -> pb.TxnOffsetCommitResponse:
        try:
            await self._rt.txn_commit_offsets(
                transactional_id=request.transactional_id, group_id=request.group_id,
                producer_id=request.producer_id, producer_epoch=request.producer_epoch,
                member_id=request.member_id, generation_id=request.generation_id,
                partitions=_commit_partitions(list(request.partitions)),
            )
        except ServiceError as exc:
            await abort_with(context, exc)
        return pb.TxnOffsetCommitResponse(results=_results(list(request.partitions)))

    async def OffsetFetch(  # noqa: N802 - gRPC method name
        self, request: pb.OffsetFetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetFetchResponse:
        try:
            fetched = self._rt.fetch_offsets(
                group_id=request.group_id, partitions=[_tp(p) for p in request.partitions],
                require_stable=request.require_stable,
            )
        except ServiceError as exc:
            await abort_with(context, exc)
        return pb.OffsetFetchResponse(partitions=[
            pb.OffsetFetchPartition(
                topic=f.tp[0], partition=f.tp[1], offset=f.offset, metadata=f.metadata,
                error=f.error.to_proto() if f.error else None,
            )
            for f in fetched
        ])

    async def ListGroups(  # noqa: N802 - gRPC method name
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListGroupsResponse:
        states = set(request.states)
        return pb.ListGroupsResponse(groups=[
            pb.GroupListing(group_id=group_id, state=state)
            for group_id, state in self._rt.list_groups()
            if not states or state in states
        ])

    async def DescribeGroups(  # noqa: N802 - gRPC method name
        self, request: pb.DescribeGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeGroupsResponse:
        out = []
        for group_id in request.group_ids:
            try:
                group, coordinator_epoch = self._rt.describe_group(group_id)
            except ServiceError as exc:
                out.append(pb.GroupDescription(group_id=group_id, error=exc.to_proto()))
                continue
            out.append(pb.GroupDescription(
                group_id=group_id, state=group.state.value, group_epoch=group.epoch,
                coordinator_epoch=coordinator_epoch,
                members=[
                    pb.MemberDescription(
                        member_id=m.member_id, group_instance_id=m.instance_id,
                        member_epoch=m.member_epoch, subscribed_topics=sorted(m.topics),
                        assignment=[_tp_proto(tp) for tp in sorted(m.owned)],
                    )
                    for _, m in sorted(group.members.items())
                ],
            ))
        return pb.DescribeGroupsResponse(groups=out)

    async def DeleteGroups(  # noqa: N802 - gRPC method name
        self, request: pb.DeleteGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteGroupsResponse:
        out = []
        for group_id in request.group_ids:
            try:
                await self._rt.delete_group(group_id)
                out.append(pb.DeleteGroupResult(group_id=group_id))
            except ServiceError as exc:
                out.append(pb.DeleteGroupResult(group_id=group_id, error=exc.to_proto()))
        return pb.DeleteGroupsResponse(results=out)
