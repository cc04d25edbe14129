"""Kafka's classic group protocol: JoinGroup (11), SyncGroup (14),
Heartbeat (12) and LeaveGroup (13), forwarded to the group coordinator that
owns the group (its classic groups: docs/groups.md, "Classic groups").

The client elected leader computes the assignment, as in Kafka: JoinGroup
hands it every member's metadata, SyncGroup carries its assignments, and
both stay opaque bytes to the coordinator. JoinGroup and a follower's
SyncGroup wait until the rebalance completes (up to the group's rebalance
timeout), so their forwarded calls get that long plus a margin. The
member's client id and address, which Kafka's DescribeGroups shows, come
from the request header and the connection.
"""

from __future__ import annotations

from typing import Any

from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ..context import RequestContext
from ..rpc.forward import DEFAULT_TIMEOUT_S

_GC = "/oncelog.v1.GroupCoordinator/"
# JoinGroup v4+ answers MEMBER_ID_REQUIRED to a dynamic member without an id
# (KIP-394).
MEMBER_ID_REQUIRED_SINCE = 4
# What a long poll may wait beyond the group's rebalance timeout before the
# forwarded call gives up (the coordinator answers first).
LONG_POLL_MARGIN_S = 10.0
# The most a forwarded JoinGroup or SyncGroup may wait: Kafka's largest
# rebalance timeout is an int32 of ms; a client rarely asks for more than
# five minutes.
MAX_LONG_POLL_S = 30 * 60.0


def _code(error: Any) -> ErrorCode | None:
    return None if error.code == 0 else ErrorCode.from_wire(error.code)


def _long_poll_s(rebalance_timeout_ms: int) -> float:
    return min(max(rebalance_timeout_ms / 1000, DEFAULT_TIMEOUT_S) + LONG_POLL_MARGIN_S,
               MAX_LONG_POLL_S)


async def join_group(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    session_timeout_ms = int(request.session_timeout.total_seconds() * 1000)
    rebalance = getattr(request, "rebalance_timeout", None)
    rebalance_timeout_ms = (int(rebalance.total_seconds() * 1000) if rebalance is not None
                            else session_timeout_ms)
    proto = gpb.JoinGroupRequest(
        group_id=request.group_id, session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms, member_id=request.member_id or "",
        group_instance_id=getattr(request, "group_instance_id", None) or "",
        protocol_type=request.protocol_type,
        protocols=[gpb.JoinGroupProtocol(name=p.name, metadata=bytes(p.metadata))
                   for p in request.protocols],
        reason=getattr(request, "reason", None) or "",
        client_id=ctx.header.client_id or "", client_host=f"/{ctx.session.host}",
        require_known_member_id=ctx.version >= MEMBER_ID_REQUIRED_SINCE)
    try:
        ctx.authorize(_GC + "JoinGroup", proto)
        response = await ctx.broker.coordinators.group(
            request.group_id, "JoinGroup", proto, gpb.JoinGroupResponse,
            timeout_s=_long_poll_s(rebalance_timeout_ms))
    except ServiceError as exc:
        return builder.response(
            throttle_time=0, error_code=ctx.code(exc), generation_id=-1, protocol_type=None,
            protocol_name=None, leader="", skip_assignment=False,
            member_id=request.member_id or "", members=())
    return builder.response(
        throttle_time=0, error_code=ctx.code(_code(response.error)),
        generation_id=response.generation_id,
        protocol_type=response.protocol_type or None,
        protocol_name=response.protocol_name or (None if ctx.version >= 7 else ""),
        leader=response.leader, skip_assignment=False, member_id=response.member_id,
        members=tuple(builder.make(
            "JoinGroupResponseMember", member_id=m.member_id,
            group_instance_id=m.group_instance_id or None, metadata=m.metadata)
            for m in response.members))


async def sync_group(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    proto = gpb.SyncGroupRequest(
        group_id=request.group_id, generation_id=int(request.generation_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None) or "",
        protocol_type=getattr(request, "protocol_type", None) or "",
        protocol_name=getattr(request, "protocol_name", None) or "",
        assignments=[gpb.SyncGroupAssignment(member_id=a.member_id,
                                             assignment=bytes(a.assignment))
                     for a in request.assignments])
    try:
        ctx.authorize(_GC + "SyncGroup", proto)
        # A follower waits for the leader's assignment, up to the group's
        # rebalance timeout (which this request does not say): the longest.
        response = await ctx.broker.coordinators.group(
            request.group_id, "SyncGroup", proto, gpb.SyncGroupResponse,
            timeout_s=MAX_LONG_POLL_S)
    except ServiceError as exc:
        return builder.response(throttle_time=0, error_code=ctx.code(exc), protocol_type=None,
                                protocol_name=None, assignment=b"")
    return builder.response(
        throttle_time=0, error_code=ctx.code(_code(response.error)),
        protocol_type=response.protocol_type or None,
        protocol_name=response.protocol_name or None, assignment=response.assignment)


async def heartbeat(ctx: RequestContext, request: Any) -> Any:
    proto = gpb.ClassicHeartbeatRequest(
        group_id=request.group_id, generation_id=int(request.generation_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None) or "")
    try:
        ctx.authorize(_GC + "ClassicHeartbeat", proto)
        response = await ctx.broker.coordinators.group(
            request.group_id, "ClassicHeartbeat", proto, gpb.ClassicHeartbeatResponse)
        code = ctx.code(_code(response.error))
    except ServiceError as exc:
        code = ctx.code(exc)
    return ctx.builder().response(throttle_time=0, error_code=code)


async def leave_group(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    if ctx.version >= 3:
        members = [gpb.LeaveGroupMember(member_id=m.member_id or "",
                                        group_instance_id=m.group_instance_id or "",
                                        reason=getattr(m, "reason", None) or "")
                   for m in request.members]
    else:
        members = [gpb.LeaveGroupMember(member_id=request.member_id)]
    proto = gpb.LeaveGroupRequest(group_id=request.group_id, members=members)
    try:
        ctx.authorize(_GC + "LeaveGroup", proto)
        response = await ctx.broker.coordinators.group(
            request.group_id, "LeaveGroup", proto, gpb.LeaveGroupResponse)
    except ServiceError as exc:
        return builder.response(throttle_time=0, error_code=ctx.code(exc), members=tuple(
            builder.make("MemberResponse", member_id=m.member_id,
                         group_instance_id=m.group_instance_id or None,
                         error_code=ctx.code(exc)) for m in members))
    results = list(response.members)
    if ctx.version < 3:
        # One member, whose answer is the request's (Kafka's v0-2).
        error = _code(results[0].error) if results else _code(response.error)
        return builder.response(throttle_time=0, error_code=ctx.code(error), members=())
    return builder.response(
        throttle_time=0, error_code=ctx.code(_code(response.error)),
        members=tuple(builder.make("MemberResponse", member_id=r.member_id,
                                   group_instance_id=r.group_instance_id or None,
                                   error_code=ctx.code(_code(r.error)))
                      for r in results))
