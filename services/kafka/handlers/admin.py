"""The admin APIs: CreateTopics (19), DeleteTopics (20), CreatePartitions
(37), DescribeConfigs (32), DescribeCluster (60), DescribeGroups (15) and
ListGroups (16).

Topics are made and removed by the store's own catalog path, the one our
Admin uses (a non-controller store forwards to the controller), with the
same checks: a replication factor of -1 or a partition count of -1 takes
the cluster's default (Kafka's num.partitions is 1 here); manual replica
assignments are refused (INVALID_REQUEST: placement is the cluster's), for
new topics and for partitions added to one alike.
Configs are a topic's effective configuration (its overrides are
DYNAMIC_TOPIC_CONFIG, the rest DEFAULT_CONFIG) or, for a broker, the few
broker settings that Kafka's tools ask about. Groups are the group
coordinators' (forwarded over gRPC).
"""

from __future__ import annotations

from typing import Any

from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import GROUP_STATES

from ...common.kernel.errors import ServiceError
from ...common.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from ...common.security.operations import CLUSTER_ACTION, Check
from ...partition_store.api import NewPartitions, TopicSpec
from ..context import RequestContext
from ..rpc.forward import GROUP_COORDINATOR
from .metadata import topic_uuid

_PS = "/oncelog.v1.PartitionStore/"
_GC = "/oncelog.v1.GroupCoordinator/"
DEFAULT_PARTITIONS = 1
# Kafka's ConfigResource types and config sources.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


# ---------------------------------------------------------------- CreateTopics


async def create_topics(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    results: dict[str, tuple[int, str | None, int]] = {}
    specs: list[TopicSpec] = []
    for topic in request.topics:
        if topic.name in results or any(s.name == topic.name for s in specs):
            results[topic.name] = (ctx.code(ErrorCode.INVALID_REQUEST),
                                   f"topic {topic.name!r} is named twice", 0)
            continue
        if topic.assignments:
            results[topic.name] = (ctx.code(ErrorCode.INVALID_REQUEST),
                                   "manual replica assignments are not taken: the cluster "
                                   "places replicas; give a replication factor instead", 0)
            continue
        partitions = int(topic.num_partitions)
        factor = int(topic.replication_factor)
        specs.append(TopicSpec(
            topic.name, DEFAULT_PARTITIONS if partitions == -1 else partitions,
            {c.name: c.value for c in topic.configs if c.value is not None},
            0 if factor == -1 else factor))
    if specs:
        proto = pb.CreateTopicsRequest(topics=[pb.TopicSpec(name=s.name) for s in specs])
        try:
            ctx.authorize(_PS + "CreateTopics", proto)
            outcomes = await ctx.broker.runtime.create_topics(
                specs, validate_only=bool(request.validate_only))
            for o in outcomes:
                results[o.name] = (ctx.code(o.error), o.error.message if o.error else None,
                                   o.topic_id)
        except ServiceError as exc:
            for s in specs:
                results[s.name] = (ctx.code(exc), exc.message, 0)
    counts = {s.name: (s.partitions, s.replication_factor) for s in specs}
    topics = []
    for name, (code, message, topic_id) in results.items():
        partitions, factor = counts.get(name, (-1, -1))
        topics.append(builder.make(
            "CreatableTopicResult", name=name, topic_id=topic_uuid(topic_id) if topic_id else 0,
            error_code=code, error_message=message, topic_config_error_code=0,
            num_partitions=partitions if not code else -1,
            replication_factor=(factor or -1) if not code else -1, configs=None))
    return builder.response(throttle_time=0, topics=tuple(topics))


# ------------------------------------------------------------ CreatePartitions


async def create_partitions(ctx: RequestContext, request: Any) -> Any:
    """Grows topics through the store's own CreatePartitions path (the
    rules and codes of docs/grpc-api.md, "Growing a topic")."""
    builder = ctx.builder()
    results: dict[str, tuple[int, str | None]] = {}
    asked: dict[str, NewPartitions] = {}
    for topic in request.topics:
        if topic.name in results or topic.name in asked:
            asked.pop(topic.name, None)
            results[topic.name] = (ctx.code(ErrorCode.INVALID_REQUEST),
                                   f"topic {topic.name!r} is named twice")
        elif topic.assignments is not None:
            results[topic.name] = (ctx.code(ErrorCode.INVALID_REQUEST),
                                   "manual replica assignments are not taken: the cluster "
                                   "places the new partitions' replicas")
        else:
            asked[topic.name] = NewPartitions(topic.name, int(topic.count))
    if asked:
        proto = pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name=name) for name in asked])
        try:
            ctx.authorize(_PS + "CreatePartitions", proto)
            outcomes = await ctx.broker.runtime.create_partitions(
                list(asked.values()), validate_only=bool(request.validate_only))
            for o in outcomes:
                results[o.name] = (ctx.code(o.error), o.error.message if o.error else None)
        except ServiceError as exc:
            for name in asked:
                results[name] = (ctx.code(exc), exc.message)
    return builder.response(throttle_time=0, results=tuple(
        builder.make("CreatePartitionsTopicResult", name=name, error_code=code,
                     error_message=message)
        for name, (code, message) in results.items()))


# ---------------------------------------------------------------- DeleteTopics


async def delete_topics(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    if ctx.version >= 6:
        names = [t.name for t in request.topics if t.name]
        by_id_only = [t for t in request.topics if not t.name]
    else:
        names = list(request.topic_names)
        by_id_only = []
    results: list[Any] = [builder.make(
        "DeletableTopicResult", name=None, topic_id=t.topic_id,
        error_code=ctx.code(ErrorCode.INVALID_REQUEST),
        error_message="name the topic: deletion by topic id is not served") for t in by_id_only]
    if names:
        proto = pb.DeleteTopicsRequest(names=names)
        try:
            ctx.authorize(_PS + "DeleteTopics", proto)
            outcomes = await ctx.broker.runtime.delete_topics(names)
            results += [builder.make(
                "DeletableTopicResult", name=o.name, topic_id=topic_uuid(o.topic_id),
                error_code=ctx.code(o.error), error_message=o.error.message if o.error else None)
                for o in outcomes]
        except ServiceError as exc:
            results += [builder.make(
                "DeletableTopicResult", name=name, topic_id=topic_uuid(0),
                error_code=ctx.code(exc), error_message=exc.message) for name in names]
    return builder.response(throttle_time=0, responses=tuple(results))


# ------------------------------------------------------------- DescribeConfigs


def _broker_configs(ctx: RequestContext) -> dict[str, str]:
    """The broker settings Kafka's tools look for, as this cluster has them."""
    return {
        "auto.create.topics.enable": "false",
        "num.partitions": str(DEFAULT_PARTITIONS),
        "broker.id": str(ctx.broker.node_id),
        "transaction.state.log.num.partitions": str(
            ctx.broker.runtime.layout.transaction_state_partitions),
        "offsets.topic.num.partitions": str(
            ctx.broker.runtime.layout.consumer_offsets_partitions),
    }


async def describe_configs(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    runtime = ctx.broker.runtime
    results = []
    for resource in request.resources:
        kind, name = int(resource.resource_type), resource.resource_name
        keys = None if resource.configuration_keys is None else set(
            resource.configuration_keys)
        try:
            if kind == RESOURCE_TOPIC:
                ctx.authorize_checks("DescribeConfigs", [Check(
                    Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name, (CLUSTER_ACTION,))])
                (lookup,) = await runtime.metadata([name], include_internal=True)
                if lookup.record is None:
                    raise lookup.error or ServiceError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                                       f"topic {name!r} does not exist")
                overrides = dict(lookup.record.config_overrides)
                values = {k: (v, SOURCE_DYNAMIC_TOPIC if k in overrides else SOURCE_DEFAULT)
                          for k, v in lookup.record.config.as_strings().items()}
            elif kind == RESOURCE_BROKER:
                ctx.authorize_checks("DescribeConfigs", [Check(
                    Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME)])
                values = {k: (v, SOURCE_STATIC_BROKER) for k, v in _broker_configs(ctx).items()}
            else:
                raise ServiceError(ErrorCode.INVALID_REQUEST,
                                   f"resource type {kind}: only topics (2) and brokers (4) "
                                   "have configs here")
        except ServiceError as exc:
            results.append(builder.make(
                "DescribeConfigsResult", error_code=ctx.code(exc), error_message=exc.message,
                resource_type=kind, resource_name=name, configs=()))
            continue
        configs = tuple(builder.make(
            "DescribeConfigsResourceResult", name=k, value=v, read_only=kind != RESOURCE_TOPIC,
            config_source=source, is_sensitive=False, is_default=source == SOURCE_DEFAULT,
            synonyms=(), config_type=0, documentation=None)
            for k, (v, source) in sorted(values.items()) if keys is None or k in keys)
        results.append(builder.make(
            "DescribeConfigsResult", error_code=0, error_message=None, resource_type=kind,
            resource_name=name, configs=configs))
    return builder.response(throttle_time=0, results=tuple(results))


# ------------------------------------------------------------- DescribeCluster


async def describe_cluster(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    brokers = tuple(builder.make("DescribeClusterBroker", broker_id=node_id, host=host,
                                 port=port, rack=None)
                    for node_id, host, port in ctx.broker.brokers())
    return builder.response(
        throttle_time=0, error_code=0, error_message=None, endpoint_type=1,
        cluster_id=ctx.broker.cluster_id, controller_id=ctx.broker.runtime.catalog_node_id,
        brokers=brokers, cluster_authorized_operations=-(2**31))


# ------------------------------------------------------- DescribeGroups, ListGroups


async def describe_groups(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    described = []
    for group_id in request.groups:
        proto = gpb.DescribeGroupsRequest(group_ids=[group_id])
        try:
            ctx.authorize(_GC + "DescribeGroups", proto)
            response = await ctx.broker.coordinators.group(
                group_id, "DescribeGroups", proto, gpb.DescribeGroupsResponse)
        except ServiceError as exc:
            described.append(builder.make(
                "DescribedGroup", error_code=ctx.code(exc), group_id=group_id, group_state="",
                protocol_type="", protocol_data="", members=(), authorized_operations=-(2**31)))
            continue
        for group in response.groups:
            described.append(_described(ctx, builder, group))
    return builder.response(throttle_time=0, groups=tuple(described))


def _described(ctx: RequestContext, builder: Any, group: Any) -> Any:
    """One group as Kafka's DescribeGroups shows it: a classic group with its
    members' metadata and assignments (opaque bytes), a server-assigned one
    (our SDK's) as a "consumer" group whose members carry none."""
    members = tuple(builder.make(
        "DescribedGroupMember", member_id=m.member_id,
        group_instance_id=m.group_instance_id or None, client_id=m.client_id,
        client_host=m.client_host, member_metadata=m.member_metadata,
        member_assignment=m.member_assignment)
        for m in group.members)
    error = None if group.error.code == 0 else ErrorCode.from_wire(group.error.code)
    return builder.make(
        "DescribedGroup", error_code=ctx.code(error), group_id=group.group_id,
        group_state=group.state, protocol_type=group.protocol_type or "consumer",
        protocol_data=group.protocol_name, members=members, authorized_operations=-(2**31))


async def list_groups(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    states = list(getattr(request, "states_filter", ()) or ())
    proto = gpb.ListGroupsRequest(states=states, states_enum=GROUP_STATES.numbers_of(states))
    coordinators = ctx.broker.coordinators
    try:
        authorizer = ctx.authorize(_GC + "ListGroups", proto)
        responses = await coordinators.each(coordinators.group_coordinators, GROUP_COORDINATOR,
                                            "ListGroups", proto, gpb.ListGroupsResponse)
    except ServiceError as exc:
        return builder.response(throttle_time=0, error_code=ctx.code(exc), groups=())
    listing = gpb.ListGroupsResponse()
    for response in responses:
        listing.groups.extend(response.groups)
    ctx.filter_answer(_GC + "ListGroups", proto, listing, authorizer)
    return builder.response(throttle_time=0, error_code=0, groups=tuple(builder.make(
        "ListedGroup", group_id=g.group_id, protocol_type=g.protocol_type or "consumer",
        group_state=g.state) for g in listing.groups))
