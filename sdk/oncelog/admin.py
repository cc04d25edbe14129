"""Admin: topics (transactions and groups administration arrive later).

Every call is synchronous, retries retriable errors (an unreachable store, the
catalog owner restarting) with backoff for up to `default_api_timeout_ms`, and
raises the typed error of `oncelog.errors` otherwise. Catalog changes go to
the store that keeps the topic catalog (Metadata's controller).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TypeVar

from oncelog import errors
from oncelog._client import ClusterClient, error_from_proto
from oncelog.errors import ErrorCode, OncelogError
from oncelog.types import NewTopic, PartitionDescription, TopicDescription
from oncelog.v1 import partition_store_pb2, partition_store_pb2_grpc, records_pb2

T = TypeVar("T")


class Admin:
    """Creates, deletes, lists and describes topics."""

    def __init__(
        self,
        *,
        bootstrap: str,
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
    ) -> None:
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
        )
        self._default_api_timeout_ms = default_api_timeout_ms

    # ------------------------------------------------------------ topics

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Creates a topic; raises TopicAlreadyExistsError, InvalidConfigError, ..."""
        exc = self.create_topics([NewTopic(name, partitions, dict(config or {}))])[name]
        if exc is not None:
            raise exc

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
        if not specs:
            return {}
        request = partition_store_pb2.CreateTopicsRequest(
            topics=[
                partition_store_pb2.TopicSpec(
                    name=t.name, partitions=t.partitions,
                    config={str(k): str(v) for k, v in t.config.items()},
                )
                for t in specs
            ],
            validate_only=validate_only,
        )

        def attempt(timeout_s: float) -> partition_store_pb2.CreateTopicsResponse:
            return self._controller().CreateTopics(request, timeout=timeout_s)

        resp = self._call("CreateTopics", attempt)
        out: dict[str, OncelogError | None] = {t.name: None for t in specs}
        for result in resp.results:
            out[result.name] = error_from_proto(result.error)
        if not validate_only:
            self._client.invalidate_metadata()
        return out

    def delete_topic(self, name: str) -> None:
        """Deletes a topic and its data; raises UnknownTopicOrPartitionError
        when there is no such topic."""
        exc = self.delete_topics([name])[name]
        if exc is not None:
            raise exc

    def delete_topics(self, names: Iterable[str]) -> dict[str, OncelogError | None]:
        """Per topic, None when it was deleted or the error that prevented it."""
        wanted = list(names)
        if not wanted:
            return {}
        request = partition_store_pb2.DeleteTopicsRequest(names=wanted)

        def attempt(timeout_s: float) -> partition_store_pb2.DeleteTopicsResponse:
            return self._controller().DeleteTopics(request, timeout=timeout_s)

        resp = self._call("DeleteTopics", attempt)
        out: dict[str, OncelogError | None] = dict.fromkeys(wanted)
        for result in resp.results:
            out[result.name] = error_from_proto(result.error)
        self._client.invalidate_metadata()
        return out

    def list_topics(self) -> dict[str, int]:
        """User topics (not the internal __ ones) and their partition counts."""
        request = partition_store_pb2.ListTopicsRequest(include_internal=False)

        def attempt(timeout_s: float) -> partition_store_pb2.ListTopicsResponse:
            return self._controller().ListTopics(request, timeout=timeout_s)

        resp = self._call("ListTopics", attempt)
        return {t.name: len(t.partitions) for t in resp.topics if not t.internal}

    def describe_topic(self, name: str) -> TopicDescription:
        """Partitions with their stores and offsets (earliest, high watermark,
        last stable offset), and the topic's effective configuration."""
        info = self._call_value("Metadata", lambda: self._client.topic(name))
        md = self._client.metadata()
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
                    leader_address=md.stores.get(info.leaders[p], ""),
                    earliest_offset=earliest[p],
                    high_watermark=high[p],
                    last_stable_offset=stable[p],
                )
                for p in partitions
            ),
            config=dict(info.config),
        )

    def _offsets(
        self,
        topic: str,
        partitions: list[int],
        timestamp_ms: int,
        isolation: records_pb2.IsolationLevel.ValueType,
    ) -> dict[int, int]:
        pending = set(partitions)
        found: dict[int, int] = {}

        def attempt(timeout_s: float) -> dict[int, int]:
            by_address: dict[str, list[int]] = {}
            for p in sorted(pending):
                by_address.setdefault(self._client.leader(topic, p), []).append(p)
            retry: OncelogError | None = None
            for address, ps in by_address.items():
                request = partition_store_pb2.ListOffsetsRequest(
                    partitions=[
                        partition_store_pb2.ListOffsetsPartition(
                            topic=topic, partition=p, timestamp_ms=timestamp_ms
                        )
                        for p in ps
                    ],
                    isolation_level=isolation,
                )
                resp = self._client.store(address).ListOffsets(request, timeout=timeout_s)
                for result in resp.results:
                    exc = error_from_proto(result.error)
                    if exc is None:
                        found[result.partition] = result.offset
                        pending.discard(result.partition)
                    elif exc.retriable:
                        retry = exc
                    else:
                        raise exc
            if pending:
                raise retry or errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"ListOffsets answered nothing for {topic} partitions {sorted(pending)}",
                )
            return found

        return self._call("ListOffsets", attempt)

    # ------------------------------------------------------------ plumbing

    def _controller(self) -> partition_store_pb2_grpc.PartitionStoreStub:
        """The store that keeps the topic catalog (any store forwards to it,
        but asking it directly saves a hop)."""
        md = self._client.cached_metadata
        if md is None:
            md = self._client.metadata()
        address = md.stores.get(md.controller_node_id, self._client.bootstrap[0])
        return self._client.store(address)

    def _call(self, what: str, attempt: Callable[[float], T]) -> T:
        return self._client.call(what, attempt, timeout_ms=self._default_api_timeout_ms)

    def _call_value(self, what: str, fn: Callable[[], T]) -> T:
        return self._client.call(what, lambda _timeout_s: fn(),
                                 timeout_ms=self._default_api_timeout_ms)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

