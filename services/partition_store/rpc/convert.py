"""Proto <-> runtime values, shared by the servicer and the controller link."""

from __future__ import annotations

from collections.abc import Callable

from oncelog.v1 import errors_pb2, partition_store_pb2
from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ..core.codec import CorruptValueError
from ..core.replicas import PartitionState
from ..core.topics import TopicRecord

OK = errors_pb2.Error()


def error_to_proto(error: ServiceError | None) -> errors_pb2.Error:
    return OK if error is None else error.to_proto()


def error_from_proto(error: errors_pb2.Error) -> ServiceError | None:
    if error.code == 0:
        return None
    return ServiceError(ErrorCode.from_wire(error.code), error.message)


def topic_metadata(
    record: TopicRecord, state_of: Callable[[str, int], PartitionState]
) -> partition_store_pb2.TopicMetadata:
    """A topic's metadata; `state_of(topic, partition)` gives each
    partition's replicas, leader, epoch and ISR."""
    partitions = []
    for p in range(record.partitions):
        state = state_of(record.name, p)
        partitions.append(partition_store_pb2.PartitionMetadata(
            partition=p, leader_node_id=state.leader, leader_epoch=state.leader_epoch,
            replica_node_ids=state.replicas, isr_node_ids=state.isr,
            target_replica_node_ids=state.target or (),
        ))
    return partition_store_pb2.TopicMetadata(
        name=record.name,
        topic_id=record.topic_id,
        internal=record.internal,
        partitions=partitions,
        config=record.config.as_strings(),
    )


def topic_record_from_metadata(meta: partition_store_pb2.TopicMetadata) -> TopicRecord:
    """A catalog record from the controller's answer (its effective config is
    taken as the overrides: same effective configuration)."""
    try:
        return TopicRecord.build(
            name=meta.name, topic_id=meta.topic_id, partitions=len(meta.partitions),
            overrides=dict(meta.config), internal=meta.internal,
        )
    except CorruptValueError as exc:
        raise ServiceError(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"the controller described topic {meta.name!r} with a configuration this "
            f"node rejects: {exc}",
        ) from exc
