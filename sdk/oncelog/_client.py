"""The cluster client every SDK object shares: addressing, channels, retries,
error translation.

One bootstrap address leads to a `Metadata` answer that names every node and
which store owns which partition; the client dials each node's advertised
address over one channel per address. Errors from the wire become typed
exceptions here, once (`translate_rpc_error`, `error_from_proto`), so the
producer, consumer and admin only ever see `oncelog.errors` classes.

Thread-safe: the producer's sender thread and the caller's threads use one
client concurrently. Metadata is an immutable snapshot replaced as a whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from oncelog import errors
from oncelog._status import error_from_rpc
from oncelog.errors import ErrorCode, OncelogError
from oncelog.v1 import (
    coordinator_pb2_grpc,
    errors_pb2,
    group_coordinator_pb2_grpc,
    partition_store_pb2,
    partition_store_pb2_grpc,
)

log = logging.getLogger("oncelog.client")

T = TypeVar("T")

# Mirrors services/common/limits.py (the SDK may not import the services): a
# produce or fetch message may carry this much.
MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
# A topic's max.message.bytes (largest encoded batch) when its config leaves it out.
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
MAX_MESSAGE_BYTES_CONFIG = "max.message.bytes"

CHANNEL_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    # gRPC's default reconnect backoff grows to two minutes; a restarted store
    # must be found again within about a second (Kafka's reconnect.backoff.max.ms).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

# Errors after which the partition's owner may have moved: ask Metadata again.
_REFRESH_ON = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
})


def translate_rpc_error(exc: grpc.RpcError) -> OncelogError:
    """The typed exception for a failed call (our Error from the status details,
    or one mapped from the bare gRPC code for transport failures)."""
    err = error_from_rpc(exc)
    return errors.error_for(err.code, err.message)


def error_from_proto(err: errors_pb2.Error) -> OncelogError | None:
    """The typed exception for an inline per-item error; None when it is NONE."""
    if err.code == 0:
        return None
    return errors.error_for(err.code, err.message)


def raise_for_error(err: errors_pb2.Error) -> None:
    """Raises the typed exception for an answer's inline error, if it has one."""
    exc = error_from_proto(err)
    if exc is not None:
        raise exc


def needs_metadata_refresh(exc: OncelogError) -> bool:
    return exc.code in _REFRESH_ON


def backoff_ms(attempt: int, *, base_ms: int, max_ms: int) -> int:
    """Exponential backoff: base, 2*base, 4*base, ... capped at max_ms (attempt >= 1)."""
    return int(min(max_ms, base_ms * (2 ** min(max(attempt - 1, 0), 20))))


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as Metadata describes it."""

    name: str
    topic_id: int
    internal: bool
    # leaders[p] is the store node id that owns partition p.
    leaders: tuple[int, ...]
    config: Mapping[str, str]

    @property
    def num_partitions(self) -> int:
        return len(self.leaders)

    @property
    def max_message_bytes(self) -> int:
        value = self.config.get(MAX_MESSAGE_BYTES_CONFIG)
        if value is None:
            return DEFAULT_MAX_MESSAGE_BYTES
        try:
            return int(value)
        except ValueError:
            return DEFAULT_MAX_MESSAGE_BYTES


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One Metadata answer, as an immutable snapshot."""

    stores: Mapping[int, str]
    coordinators: tuple[str, ...]
    group_coordinators: tuple[str, ...]
    topics: Mapping[str, TopicInfo]
    controller_node_id: int
    fetched_at_s: float

    def leader_address(self, topic: str, partition: int) -> str | None:
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.leaders):
            return None
        return self.stores.get(info.leaders[partition])

    @classmethod
    def from_proto(cls, resp: partition_store_pb2.MetadataResponse) -> ClusterMetadata:
        topics: dict[str, TopicInfo] = {}
        for t in resp.topics:
            if t.error.code != 0:
                continue
            leaders = [0] * len(t.partitions)
            for p in t.partitions:
                if 0 <= p.partition < len(leaders):
                    leaders[p.partition] = p.leader_node_id
            topics[t.name] = TopicInfo(
                name=t.name, topic_id=t.topic_id, internal=t.internal,
                leaders=tuple(leaders), config=dict(t.config),
            )
        return cls(
            stores={n.node_id: n.address for n in resp.stores},
            coordinators=tuple(n.address for n in resp.coordinators),
            group_coordinators=tuple(n.address for n in resp.group_coordinators),
            topics=topics,
            controller_node_id=resp.controller_node_id,
            fetched_at_s=time.monotonic(),
        )


def split_bootstrap(bootstrap: str) -> tuple[str, ...]:
    addresses = tuple(a.strip() for a in bootstrap.split(",") if a.strip())
    if not addresses:
        raise ValueError(f"bootstrap must name at least one host:port, got {bootstrap!r}")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap address {address!r} is not host:port")
    return addresses


class ClusterClient:
    """Channels, stubs and metadata for one SDK object (producer, consumer, admin)."""

    def __init__(
        self,
        bootstrap: str,
        *,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
    ) -> None:
        if request_timeout_ms <= 0:
            raise ValueError(f"request_timeout_ms must be positive, got {request_timeout_ms}")
        if retry_backoff_ms <= 0 or retry_backoff_max_ms < retry_backoff_ms:
            raise ValueError(
                f"need 0 < retry_backoff_ms <= retry_backoff_max_ms, got "
                f"{retry_backoff_ms} and {retry_backoff_max_ms}"
            )
        self.bootstrap = split_bootstrap(bootstrap)
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stores: dict[str, partition_store_pb2_grpc.PartitionStoreStub] = {}
        self._coordinators: dict[str, coordinator_pb2_grpc.TransactionCoordinatorStub] = {}
        self._group_coordinators: dict[str, group_coordinator_pb2_grpc.GroupCoordinatorStub] = {}
        self._metadata: ClusterMetadata | None = None
        # Serializes Metadata calls; a caller that waited for another caller's
        # refresh uses its answer instead of asking again.
        self._refresh_lock = threading.Lock()
        self._metadata_version = 0
        self._stale = False
        self._background_refresh = False
        self._last_background_refresh_s = 0.0
        self._closed = False

    # ------------------------------------------------------------- channels

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("the client is closed")
            ch = self._channels.get(address)
            if ch is None:
                ch = grpc.insecure_channel(address, options=list(CHANNEL_OPTIONS))
                self._channels[address] = ch
            return ch

    def store(self, address: str) -> partition_store_pb2_grpc.PartitionStoreStub:
        stub = self._stores.get(address)
        if stub is None:
            stub = partition_store_pb2_grpc.PartitionStoreStub(self.channel(address))
            self._stores[address] = stub
        return stub

    def coordinator(self, address: str) -> coordinator_pb2_grpc.TransactionCoordinatorStub:
        stub = self._coordinators.get(address)
        if stub is None:
            stub = coordinator_pb2_grpc.TransactionCoordinatorStub(self.channel(address))
            self._coordinators[address] = stub
        return stub

    def group_coordinator(self, address: str) -> group_coordinator_pb2_grpc.GroupCoordinatorStub:
        stub = self._group_coordinators.get(address)
        if stub is None:
            stub = group_coordinator_pb2_grpc.GroupCoordinatorStub(self.channel(address))
            self._group_coordinators[address] = stub
        return stub

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stores.clear()
            self._coordinators.clear()
            self._group_coordinators.clear()
        for ch in channels:
            ch.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------- metadata

    def metadata(self) -> ClusterMetadata:
        """The current snapshot, fetched on first use; an old one is refreshed in
        the background while it keeps serving."""
        md = self._metadata
        if md is None or self._stale:
            self._stale = False
            return self.refresh_metadata(timeout_ms=self.request_timeout_ms)
        if (time.monotonic() - md.fetched_at_s) * 1000 > self.metadata_max_age_ms:
            self.request_metadata_refresh()
        return md

    def invalidate_metadata(self) -> None:
        """The next metadata() asks again (we just changed the topic catalog)."""
        self._stale = True

    @property
    def cached_metadata(self) -> ClusterMetadata | None:
        return self._metadata

    @property
    def metadata_version(self) -> int:
        """Grows with every Metadata answer: caches derived from metadata compare it."""
        return self._metadata_version

    def refresh_metadata(self, *, timeout_ms: int | None = None) -> ClusterMetadata:
        """Asks for Metadata: the controller first, then the bootstrap addresses,
        then every other known store. With timeout_ms, keeps retrying with
        backoff until then; without, tries each address once."""
        version = self._metadata_version
        with self._refresh_lock:
            if self._metadata_version != version and self._metadata is not None:
                return self._metadata
            deadline_s = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
            attempt = 0
            while True:
                attempt += 1
                try:
                    md = self._fetch_metadata_once(deadline_s)
                except OncelogError as exc:
                    if deadline_s is None:
                        raise
                    pause_s = backoff_ms(
                        attempt, base_ms=self.retry_backoff_ms, max_ms=self.retry_backoff_max_ms
                    ) / 1000
                    if time.monotonic() + pause_s >= deadline_s:
                        raise errors.KafkaTimeoutError(
                            f"no Metadata answer from {', '.join(self._metadata_addresses())} "
                            f"within {timeout_ms} ms; last error: "
                            f"{type(exc).__name__}: {exc.message or exc.code.name}"
                        ) from exc
                    time.sleep(pause_s)
                    continue
                self._metadata = md
                self._metadata_version += 1
                return md

    def _metadata_addresses(self) -> list[str]:
        md = self._metadata
        addresses: list[str] = []
        if md is not None and md.controller_node_id in md.stores:
            addresses.append(md.stores[md.controller_node_id])
        addresses.extend(self.bootstrap)
        if md is not None:
            addresses.extend(md.stores.values())
        return list(dict.fromkeys(addresses))

    def _fetch_metadata_once(self, deadline_s: float | None) -> ClusterMetadata:
        last: OncelogError | None = None
        request = partition_store_pb2.MetadataRequest(include_internal=True)
        for address in self._metadata_addresses():
            timeout_s = self.request_timeout_ms / 1000
            if deadline_s is not None:
                timeout_s = max(0.001, min(timeout_s, deadline_s - time.monotonic()))
            try:
                resp = self.store(address).Metadata(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                last = translate_rpc_error(exc)
                log.debug("Metadata from %s failed: %s", address, last)
                continue
            return ClusterMetadata.from_proto(resp)
        if last is None:  # pragma: no cover - _metadata_addresses is never empty
            last = errors.error_for(ErrorCode.NETWORK_EXCEPTION, "no address to ask for Metadata")
        raise last

    def request_metadata_refresh(self) -> None:
        """Starts a background refresh (at most one at a time, at most one per
        retry_backoff_ms) and returns at once: for threads that must not block."""
        with self._lock:
            now = time.monotonic()
            if self._background_refresh or self._closed:
                return
            if (now - self._last_background_refresh_s) * 1000 < self.retry_backoff_ms:
                return
            self._background_refresh = True
            self._last_background_refresh_s = now
        threading.Thread(
            target=self._refresh_in_background, name="oncelog-metadata", daemon=True
        ).start()

    def _refresh_in_background(self) -> None:
        try:
            self.refresh_metadata()
        except OncelogError as exc:
            log.debug("background metadata refresh failed: %s", exc)
        except Exception:  # pragma: no cover - a bug; keep the thread's death visible
            log.exception("background metadata refresh crashed")
        finally:
            with self._lock:
                self._background_refresh = False

    def topic(self, name: str, *, refresh_if_missing: bool = True) -> TopicInfo:
        """The topic's metadata; asks Metadata again once when it is not known
        (it may have been created since), then raises UnknownTopicOrPartitionError."""
        info = self.metadata().topics.get(name)
        if info is None and refresh_if_missing:
            info = self.refresh_metadata(timeout_ms=self.request_timeout_ms).topics.get(name)
        if info is None:
            raise errors.error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            )
        return info

    def leader(self, topic: str, partition: int) -> str:
        """The advertised address of the store that owns a partition."""
        info = self.topic(topic)
        if not 0 <= partition < info.num_partitions:
            raise errors.error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has {info.num_partitions} partitions, no partition {partition}",
            )
        address = self.metadata().stores.get(info.leaders[partition])
        if address is None:
            raise errors.error_for(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"partition {topic}-{partition} is owned by store node "
                f"{info.leaders[partition]}, which Metadata does not list",
            )
        return address

    # ------------------------------------------------------------ retrying

    def call(
        self,
        what: str,
        attempt_fn: Callable[[float], T],
        *,
        timeout_ms: int | None = None,
    ) -> T:
        """Runs attempt_fn(timeout_s) until it returns, retrying retriable errors
        with backoff (refreshing metadata where the owner may have moved) until
        timeout_ms (default: request_timeout_ms) has passed.

        attempt_fn raises grpc.RpcError or OncelogError; anything else passes
        through. UNKNOWN_TOPIC_OR_PARTITION is retried once, after a metadata
        refresh (the topic may be newer than our metadata).
        """
        budget_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline_s = time.monotonic() + budget_ms / 1000
        attempt = 0
        unknown_topic_retried = False
        while True:
            attempt += 1
            remaining_s = deadline_s - time.monotonic()
            timeout_s = max(0.001, min(self.request_timeout_ms / 1000, remaining_s))
            try:
                return attempt_fn(timeout_s)
            except grpc.RpcError as rpc_exc:
                exc = translate_rpc_error(rpc_exc)
            except OncelogError as oncelog_exc:
                exc = oncelog_exc
            if exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not unknown_topic_retried:
                unknown_topic_retried = True
                self._refresh_quietly()
                continue
            if not exc.retriable:
                raise exc
            pause_s = backoff_ms(
                attempt, base_ms=self.retry_backoff_ms, max_ms=self.retry_backoff_max_ms
            ) / 1000
            if time.monotonic() + pause_s >= deadline_s:
                if isinstance(exc, errors.KafkaTimeoutError):
                    raise exc  # already says what timed out
                raise errors.KafkaTimeoutError(
                    f"{what} did not succeed within {budget_ms} ms; last error: "
                    f"{type(exc).__name__}: {exc.message or exc.code.name}"
                ) from exc
            time.sleep(pause_s)
            if needs_metadata_refresh(exc):
                self._refresh_quietly()

    def _refresh_quietly(self) -> None:
        try:
            self.refresh_metadata()
        except OncelogError as exc:
            log.debug("metadata refresh failed: %s", exc)
