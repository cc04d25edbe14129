"""gRPC servicer of the group coordinator: proto -> call -> proto/status.

Request-level failures travel as a gRPC status carrying our Error (as in the
other services); the responses' own `error` fields are left NONE, except
OffsetFetch's per-partition UNSTABLE_OFFSET_COMMIT, DescribeGroups' and
DeleteGroups' per-group results, and the classic group protocol's outcomes
(JoinGroup, SyncGroup, ClassicHeartbeat, LeaveGroup per member), which are
answers that come with other fields, as in Kafka's responses.
"""

from __future__ import annotations

import grpc

from oncelog.v1 import errors_pb2, records_pb2
from oncelog.v1 import group_coordinator_pb2 as pb
from oncelog.v1 import group_coordinator_pb2_grpc as pb_grpc
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import GROUP_STATES, EnumPairError

from ...common.kernel.errors import ServiceError
from ...common.rpc.local_calls import InProcess
from ..core import classic as cl
from ..core import consumer_protocol
from ..core import groups as gr
from ..runtime import TP, GroupCoordinatorRuntime

_SERVICE = pb.DESCRIPTOR.services_by_name["GroupCoordinator"]
SERVICE_NAME = _SERVICE.full_name


def _tp(p: records_pb2.TopicPartition) -> TP:
    return p.topic, p.partition


def _tp_proto(tp: TP) -> records_pb2.TopicPartition:
    return records_pb2.TopicPartition(topic=tp[0], partition=tp[1])


def _commit_partitions(parts: list[pb.OffsetCommitPartition]) -> list[tuple[TP, int, str]]:
    return [((p.topic, p.partition), p.offset, p.metadata) for p in parts]


def _results(parts: list[pb.OffsetCommitPartition]) -> list[pb.OffsetPartitionResult]:
    return [pb.OffsetPartitionResult(topic=p.topic, partition=p.partition) for p in parts]


def _error(error: ServiceError | None) -> errors_pb2.Error | None:
    return error.to_proto() if error is not None else None


def _describe(group_id: str, group: cl.AnyGroup | None,
              coordinator_epoch: int) -> pb.GroupDescription:
    if isinstance(group, cl.ClassicGroup):
        return _describe_classic(group, coordinator_epoch)
    if group is None:
        # Committed offsets alone: an Empty group without protocol (Kafka's
        # "simple" group).
        return pb.GroupDescription(group_id=group_id, state=gr.GroupState.EMPTY.value,
                                   state_enum=GROUP_STATES.number(gr.GroupState.EMPTY.value),
                                   coordinator_epoch=coordinator_epoch,
                                   group_type=cl.CLASSIC)
    return pb.GroupDescription(
        group_id=group_id, state=group.state.value,
        state_enum=GROUP_STATES.number(group.state.value), group_epoch=group.epoch,
        coordinator_epoch=coordinator_epoch, protocol_type=cl.CONSUMER_PROTOCOL_TYPE,
        group_type=cl.CONSUMER,
        members=[
            pb.MemberDescription(
                member_id=m.member_id, group_instance_id=m.instance_id,
                member_epoch=m.member_epoch, subscribed_topics=sorted(m.topics),
                assignment=[_tp_proto(tp) for tp in sorted(m.owned)],
            )
            for _, m in sorted(group.members.items())
        ],
    )


def _describe_classic(group: cl.ClassicGroup, coordinator_epoch: int) -> pb.GroupDescription:
    consumer = group.protocol_type == cl.CONSUMER_PROTOCOL_TYPE
    members = []
    for m, metadata in cl.members_description(group):
        # Kafka's consumers' bytes are decoded for the fields every group
        # fills; other protocols' stay opaque.
        topics = consumer_protocol.subscribed_topics(metadata) if consumer else None
        assigned = consumer_protocol.assigned_partitions(m.assignment) if consumer else None
        members.append(pb.MemberDescription(
            member_id=m.member_id, group_instance_id=m.instance_id,
            member_epoch=group.generation_id, subscribed_topics=sorted(topics or ()),
            assignment=[_tp_proto(tp) for tp in sorted(assigned or ())],
            client_id=m.client_id, client_host=m.client_host, member_metadata=metadata,
            member_assignment=m.assignment,
        ))
    return pb.GroupDescription(
        group_id=group.group_id, state=group.state.value,
        state_enum=GROUP_STATES.number(group.state.value), group_epoch=group.generation_id,
        coordinator_epoch=coordinator_epoch, protocol_type=group.protocol_type,
        protocol_name=group.protocol_name, group_type=cl.CLASSIC,
        members=sorted(members, key=lambda d: d.member_id),
    )


class GroupCoordinatorServicer(pb_grpc.GroupCoordinatorServicer):
    """Every method reads nothing from its gRPC context (None when the call
    is made in process), so each answers the same over gRPC and in process."""

    def __init__(self, runtime: GroupCoordinatorRuntime) -> None:
        self._rt = runtime

    def serve_in_process(self, local: InProcess) -> None:
        """Answers the calls of the store that runs this coordinator in its
        process (services/common/rpc/local_calls.py): what its Kafka listener
        forwards, every method of the service."""
        for method in _SERVICE.methods:
            local.serve(f"/{SERVICE_NAME}/{method.name}", getattr(self, method.name))

    async def ConsumerGroupHeartbeat(  # noqa: N802 - gRPC method name
        self, request: pb.ConsumerGroupHeartbeatRequest,
        context: grpc.aio.ServicerContext | None = None,
    ) -> pb.ConsumerGroupHeartbeatResponse:
        answer = await self._rt.heartbeat(
            group_id=request.group_id, member_id=request.member_id,
            member_epoch=request.member_epoch, instance_id=request.group_instance_id,
            topics=list(request.subscribed_topics),
            session_timeout_ms=request.session_timeout_ms,
            owned_partitions=[_tp(p) for p in request.owned_partitions],
        )
        return pb.ConsumerGroupHeartbeatResponse(
            member_id=answer.member_id, member_epoch=answer.member_epoch,
            heartbeat_interval_ms=answer.heartbeat_interval_ms, has_assignment=True,
            assignment=[_tp_proto(tp) for tp in sorted(answer.assignment)],
        )

    async def OffsetCommit(  # noqa: N802 - gRPC method name
        self, request: pb.OffsetCommitRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.OffsetCommitResponse:
        await self._rt.commit_offsets(
            group_id=request.group_id, member_id=request.member_id,
            generation_id=request.generation_id,
            partitions=_commit_partitions(list(request.partitions)),
            instance_id=request.group_instance_id,
        )
        return pb.OffsetCommitResponse(results=_results(list(request.partitions)))

    async def TxnOffsetCommit(  # noqa: N802 - gRPC method name
        self, request: pb.TxnOffsetCommitRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.TxnOffsetCommitResponse:
        await self._rt.txn_commit_offsets(
            transactional_id=request.transactional_id, group_id=request.group_id,
            producer_id=request.producer_id, producer_epoch=request.producer_epoch,
            member_id=request.member_id, generation_id=request.generation_id,
            partitions=_commit_partitions(list(request.partitions)),
            instance_id=request.group_instance_id,
        )
        return pb.TxnOffsetCommitResponse(results=_results(list(request.partitions)))

    async def OffsetFetch(  # noqa: N802 - gRPC method name
        self, request: pb.OffsetFetchRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.OffsetFetchResponse:
        fetched = self._rt.fetch_offsets(
            group_id=request.group_id, partitions=[_tp(p) for p in request.partitions],
            require_stable=request.require_stable,
        )
        return pb.OffsetFetchResponse(partitions=[
            pb.OffsetFetchPartition(
                topic=f.tp[0], partition=f.tp[1], offset=f.offset, metadata=f.metadata,
                error=f.error.to_proto() if f.error else None,
            )
            for f in fetched
        ])

    async def ListGroups(  # noqa: N802 - gRPC method name
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.ListGroupsResponse:
        try:
            # The states as the strings or the enums name them (Kafka's names
            # in any spelling, as Kafka's ListGroups reads them); a state not
            # known here matches nothing.
            states = GROUP_STATES.request_filter(
                "states", list(request.states_enum), list(request.states))
        except EnumPairError as exc:
            raise ServiceError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
        wanted = None if states is None else {state.value for state in states}
        types = set(request.types)
        return pb.ListGroupsResponse(groups=[
            pb.GroupListing(group_id=g.group_id, state=g.state,
                            state_enum=GROUP_STATES.number(g.state),
                            protocol_type=g.protocol_type, group_type=g.group_type)
            for g in self._rt.list_groups()
            if (wanted is None or g.state in wanted)
            and (not types or g.group_type in types)
        ])

    async def DescribeGroups(  # noqa: N802 - gRPC method name
        self, request: pb.DescribeGroupsRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.DescribeGroupsResponse:
        out = []
        for group_id in request.group_ids:
            try:
                group, coordinator_epoch = self._rt.describe_group(group_id)
            except ServiceError as exc:
                out.append(pb.GroupDescription(group_id=group_id, error=exc.to_proto()))
                continue
            out.append(_describe(group_id, group, coordinator_epoch))
        return pb.DescribeGroupsResponse(groups=out)

    async def DeleteGroups(  # noqa: N802 - gRPC method name
        self, request: pb.DeleteGroupsRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.DeleteGroupsResponse:
        out = []
        for group_id in request.group_ids:
            try:
                await self._rt.delete_group(group_id)
                out.append(pb.DeleteGroupResult(group_id=group_id))
            except ServiceError as exc:
                out.append(pb.DeleteGroupResult(group_id=group_id, error=exc.to_proto()))
        return pb.DeleteGroupsResponse(results=out)

    # ---------------------------------------------------- classic protocol

    async def JoinGroup(  # noqa: N802 - gRPC method name
        self, request: pb.JoinGroupRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.JoinGroupResponse:
        reply = await self._rt.join_group(
            group_id=request.group_id, member_id=request.member_id,
            instance_id=request.group_instance_id, protocol_type=request.protocol_type,
            protocols=[cl.Protocol(p.name, p.metadata) for p in request.protocols],
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms, reason=request.reason,
            client_id=request.client_id, client_host=request.client_host,
            require_known_member_id=request.require_known_member_id,
        )
        return pb.JoinGroupResponse(
            error=_error(reply.error), generation_id=reply.generation_id,
            protocol_type=reply.protocol_type, protocol_name=reply.protocol_name,
            leader=reply.leader, member_id=reply.member_id,
            members=[pb.JoinGroupMember(member_id=m.member_id, group_instance_id=m.instance_id,
                                        metadata=m.metadata) for m in reply.members],
        )

    async def SyncGroup(  # noqa: N802 - gRPC method name
        self, request: pb.SyncGroupRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.SyncGroupResponse:
        reply = await self._rt.sync_group(
            group_id=request.group_id, member_id=request.member_id,
            instance_id=request.group_instance_id, generation_id=request.generation_id,
            protocol_type=request.protocol_type, protocol_name=request.protocol_name,
            assignments=[(a.member_id, a.assignment) for a in request.assignments],
        )
        return pb.SyncGroupResponse(error=_error(reply.error), protocol_type=reply.protocol_type,
                                    protocol_name=reply.protocol_name,
                                    assignment=reply.assignment)

    async def ClassicHeartbeat(  # noqa: N802 - gRPC method name
        self, request: pb.ClassicHeartbeatRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.ClassicHeartbeatResponse:
        reply = await self._rt.classic_heartbeat(
            group_id=request.group_id, member_id=request.member_id,
            instance_id=request.group_instance_id, generation_id=request.generation_id,
        )
        return pb.ClassicHeartbeatResponse(error=_error(reply.error))

    async def LeaveGroup(  # noqa: N802 - gRPC method name
        self, request: pb.LeaveGroupRequest, context: grpc.aio.ServicerContext | None = None
    ) -> pb.LeaveGroupResponse:
        results = await self._rt.leave_group(group_id=request.group_id, members=[
            cl.LeavingMember(m.member_id, m.group_instance_id, m.reason)
            for m in request.members
        ])
        return pb.LeaveGroupResponse(members=[
            pb.LeaveGroupMemberResult(member_id=r.member_id, group_instance_id=r.instance_id,
                                      error=_error(r.error))
            for r in results
        ])
