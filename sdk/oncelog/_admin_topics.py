"""Admin's topic calls: create, grow, move, delete, list, describe."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from oncelog._admin_base import (
    AdminBase,
    _within_budget,
)
from oncelog._client import (
    error_from_proto,
)
from oncelog.types import (
    NewTopic,
    PartitionDescription,
    TopicDescription,
    TopicPartition,
)
from oncelog.v1 import (
    partition_store_pb2,
    records_pb2,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError


class TopicsAdmin(AdminBase):
    """Creates, grows, moves, deletes, lists and describes topics."""

    # ------------------------------------------------------------ topics

    @_within_budget
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
        *, replication_factor: int = 0, exist_ok: bool = False,
    ) -> None:
        """Creates a topic; raises TopicAlreadyExistsError, InvalidConfigError, ...

        With `exist_ok=True` a topic of that name that already exists is not an
        error (its partition count and config are left as they are), so a
        script that sets up its topics can run again."""
        exc = self.create_topics(
            [NewTopic(name, partitions, dict(config or {}), replication_factor)])[name]
        if exc is not None and not (exist_ok and isinstance(exc, errors.TopicAlreadyExistsError)):
            raise exc

    @_within_budget
    def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, OncelogError | None]:
        """Creates several topics in one request; per topic, None when it was
        created (or, with validate_only, would be) or the error that prevented it."""
        specs = list(topics)
        for spec in specs:
            if not isinstance(spec, NewTopic):
                raise TypeError(f"create_topics() takes NewTopic values, got {spec!r}")
            if type(spec.partitions) is not int:
                raise TypeError(f"partitions must be an int, got {spec.partitions!r}")
            if type(spec.replication_factor) is not int or spec.replication_factor < 0:
                raise ValueError(f"replication_factor must be an int >= 0 (0: the cluster's "
                                 f"default), got {spec.replication_factor!r}")
        if not specs:
            return {}
        request = partition_store_pb2.CreateTopicsRequest(
            topics=[
                partition_store_pb2.TopicSpec(
                    name=t.name, partitions=t.partitions,
                    config={str(k): str(v) for k, v in t.config.items()},
                    replication_factor=t.replication_factor,
                )
                for t in specs
            ],
            validate_only=validate_only,
        )

        resp = self._catalog_call("CreateTopics", lambda stub: stub.CreateTopics, request)
        out: dict[str, OncelogError | None] = {t.name: None for t in specs}
        for result in resp.results:
            out[result.name] = error_from_proto(result.error)
        if not validate_only:
            self._client.invalidate_metadata()
        return out

    @_within_budget
    def create_partitions(
        self, new_partitions: Mapping[str, int], *, validate_only: bool = False
    ) -> None:
        """Grows topics to a new total partition count each (Kafka's
        createPartitions): `{"payments": 6}` gives payments 6 partitions in
        all. Existing partitions keep their records; keys hashed over the
        count may go to other partitions from now on. With validate_only
        the cluster checks the request and changes nothing.

        Each topic is handled on its own; the first refusal, in the order
        given, is raised (its message names the topic): InvalidPartitionsError
        (the count does not grow, or is over the limit),
        UnknownTopicOrPartitionError, InvalidRequestError (an internal topic).
        A retry after a lost answer that finds the topic already grown to
        the count asked for counts as done."""
        counts = dict(new_partitions)
        for name, count in counts.items():
            if not isinstance(name, str):
                raise TypeError(f"create_partitions() takes topic names as keys, got {name!r}")
            if type(count) is not int:
                raise TypeError(f"{name}: the new partition count must be an int, got {count!r}")
        if not counts:
            return
        request = partition_store_pb2.CreatePartitionsRequest(
            topics=[partition_store_pb2.CreatePartitionsTopic(name=name, count=count)
                    for name, count in counts.items()],
            validate_only=validate_only,
        )
        sent = 0

        def attempt(timeout_s: float) -> partition_store_pb2.CreatePartitionsResponse:
            nonlocal sent
            deadline_s = time.monotonic() + timeout_s
            address, stub = self._controller(timeout_s)
            sent += 1
            return self._rpc(address, stub.CreatePartitions, request, deadline_s)

        resp = self._call("CreatePartitions", attempt)
        failures: dict[str, OncelogError] = {}
        for result in resp.results:
            exc = error_from_proto(result.error)
            if exc is not None:
                failures[result.name] = exc
        if not validate_only:
            self._client.invalidate_metadata()
            if sent > 1 and any(e.code is ErrorCode.INVALID_PARTITIONS
                                for e in failures.values()):
                # An earlier attempt may have grown the topic and lost its answer.
                topics = self._refreshed_metadata().topics
                for name, exc in list(failures.items()):
                    info = topics.get(name)
                    if (exc.code is ErrorCode.INVALID_PARTITIONS and info is not None
                            and info.num_partitions == counts[name]):
                        del failures[name]
        for name in counts:
            if name in failures:
                raise failures[name]

    @_within_budget
    def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int]],
    ) -> dict[TopicPartition, OncelogError | None]:
        """Moves partitions to new replica lists, the preferred leader first
        (Kafka's alterPartitionReassignments): the new replicas copy the log
        while producers and consumers go on, join the in-sync set, then the
        replicas left out are dropped (and lead no more). Per partition, None
        when the move started, or the error that refused it. A replicated
        cluster only (docs/replication.md)."""
        moves = dict(reassignments)
        for tp, replicas in moves.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"reassignments are keyed by TopicPartition, got {tp!r}")
            if not replicas or any(type(r) is not int or r < 0 for r in replicas):
                raise ValueError(f"{tp.topic}-{tp.partition}: replicas must be store node "
                                 f"ids (ints >= 0), got {list(replicas)!r}")
        if not moves:
            return {}
        request = partition_store_pb2.AlterPartitionReassignmentsRequest(partitions=[
            partition_store_pb2.ReassignPartition(
                topic=tp.topic, partition=tp.partition, replica_node_ids=list(replicas))
            for tp, replicas in moves.items()
        ])
        resp = self._catalog_call("AlterPartitionReassignments",
                                  lambda stub: stub.AlterPartitionReassignments, request)
        out: dict[TopicPartition, OncelogError | None] = {tp: None for tp in moves}
        for result in resp.results:
            out[TopicPartition(result.topic, result.partition)] = error_from_proto(result.error)
        self._client.invalidate_metadata()
        return out

    @_within_budget
    def list_partition_reassignments(self) -> dict[TopicPartition, tuple[int, ...]]:
        """Moves in progress: partition -> the replica list asked for."""
        md = self._refreshed_metadata()
        return {
            TopicPartition(info.name, p): target
            for info in md.topics.values()
            for p, target in enumerate(info.targets) if target
        }

    @_within_budget
    def delete_topic(self, name: str) -> None:
        """Deletes a topic and its data; raises UnknownTopicOrPartitionError
        when there is no such topic."""
        exc = self.delete_topics([name])[name]
        if exc is not None:
            raise exc

    @_within_budget
    def delete_topics(self, names: Iterable[str]) -> dict[str, OncelogError | None]:
        """Per topic, None when it was deleted or the error that prevented it."""
        wanted = list(names)
        if not wanted:
            return {}
        request = partition_store_pb2.DeleteTopicsRequest(names=wanted)

        resp = self._catalog_call("DeleteTopics", lambda stub: stub.DeleteTopics, request)
        out: dict[str, OncelogError | None] = dict.fromkeys(wanted)
        for result in resp.results:
            out[result.name] = error_from_proto(result.error)
        self._client.invalidate_metadata()
        return out

    @_within_budget
    def list_topics(self) -> dict[str, int]:
        """User topics (not the internal __ ones) and their partition counts."""
        return self._user_topics()

    @_within_budget
    def describe_topic(self, name: str) -> TopicDescription:
        """Partitions with their stores and offsets (earliest, high watermark,
        last stable offset), and the topic's effective configuration. Asks
        the cluster afresh (leaders and in-sync replicas change: a cached
        answer would go on showing a store out of sync that is back)."""
        fresh = self._refreshed_metadata()
        info = fresh.topics.get(name) or self._topic(name)
        md = self._client.cached_metadata or fresh
        stores = md.stores
        partitions = list(range(info.num_partitions))
        earliest = self._offsets(name, partitions, -2, records_pb2.READ_UNCOMMITTED)
        high = self._offsets(name, partitions, -1, records_pb2.READ_UNCOMMITTED)
        stable = self._offsets(name, partitions, -1, records_pb2.READ_COMMITTED)
        return TopicDescription(
            name=info.name,
            topic_id=info.topic_id,
            internal=info.internal,
            partitions=tuple(
                PartitionDescription(
                    partition=p,
                    leader_node_id=info.leaders[p],
                    leader_address=stores.get(info.leaders[p], ""),
                    earliest_offset=earliest[p],
                    high_watermark=high[p],
                    last_stable_offset=stable[p],
                    leader_epoch=info.leader_epochs[p] if info.leader_epochs else 0,
                    replicas=info.replicas[p] if info.replicas else (),
                    isr=info.isr[p] if info.isr else (),
                    target_replicas=info.targets[p] if info.targets else (),
                )
                for p in partitions
            ),
            config=dict(info.config),
        )
