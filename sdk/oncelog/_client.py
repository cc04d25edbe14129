"""The cluster client every SDK object shares: addressing, channels, retries,
error translation.

One bootstrap address leads to a `Metadata` answer that names every node and
which store owns which partition; the client dials each node's advertised
address over one channel per address. Errors from the wire become typed
exceptions here, once (`translate_rpc_error`, `error_from_proto`), so the
producer, consumer and admin only ever see `oncelog.errors` classes.

Timeouts bound whole calls: `metadata`, `topic`, `leader` and `call` take
the caller's budget and spend no more than it on connecting, waiting for
another thread's Metadata request, retries and backoff together. When the
budget runs out because no service answered, the KafkaTimeoutError says so
in words and names the addresses (`describe_unanswered`); the raw gRPC status
stays in its `__cause__` chain.

Channels are plain text, or TLS with the client's certificate and bearer
token (oncelog._security, the `security` a client is made with). Failures
that retrying cannot mend are raised at once as AuthenticationFailedError,
saying what is wrong: a TLS handshake that failed, a token provider that
raised, a plain-text client at an address that serves TLS, or a client
without a certificate at one that requires one (the last two found by a
TLS handshake of our own when a connection is closed at once); so are the
authorization refusals of Metadata (`is_security_error`), and a topic left
out of Metadata because the principal may not see it is reported as the
TopicAuthorizationFailedError it is (`topic_refusal`).

Thread-safe: the producer's sender thread and the caller's threads use one
client concurrently. Metadata is an immutable snapshot replaced as a whole.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from oncelog._security import (
    PLAINTEXT_CONFIG,
    PROBE_PLAIN,
    PROBE_TLS_CLOSED,
    SecurityConfig,
    client_certificate_needed_message,
    plaintext_to_tls_message,
    probe_tls,
    tls_failure,
)
from oncelog.v1 import (
    coordinator_pb2_grpc,
    errors_pb2,
    group_coordinator_pb2_grpc,
    partition_store_pb2,
    partition_store_pb2_grpc,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.limits import (
    CHANNEL_OPTIONS,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from oncelog.wire.status import STATUS_DETAILS_KEY, error_from_rpc

log = logging.getLogger("oncelog.client")

T = TypeVar("T")

MAX_MESSAGE_BYTES_CONFIG = "max.message.bytes"

# Errors after which the partition's owner may have moved: ask Metadata again.
_REFRESH_ON = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NETWORK_EXCEPTION,
    # A node that accepts connections and answers nothing (paused, hung):
    # its partitions may have moved meanwhile (Kafka's client treats a
    # request timeout as a disconnection and refreshes metadata too).
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
})


def translate_rpc_error(exc: grpc.RpcError, security: SecurityConfig | None = None
                        ) -> OncelogError:
    """The typed exception for a failed call (our Error from the status details,
    or one mapped from the bare gRPC code for transport failures). A TLS
    handshake that failed, or a token provider that raised, is an
    AuthenticationFailedError saying so (`security`: the client's settings,
    named in the message)."""
    err = error_from_rpc(exc)
    if err.code == ErrorCode.NETWORK_EXCEPTION:
        details = (exc.details() if hasattr(exc, "details") else None) or ""
        failure = tls_failure(details, security)
        if failure is not None:
            return errors.error_for(ErrorCode.SASL_AUTHENTICATION_FAILED, failure)
    return errors.error_for(err.code, err.message)


# Refusals that the same request meets again until an operator changes
# something (a certificate, a token, an ACL): a client raises them at once
# instead of retrying until its time budget runs out.
SECURITY_ERROR_CODES = frozenset({
    ErrorCode.SASL_AUTHENTICATION_FAILED,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
})


def is_security_error(exc: OncelogError) -> bool:
    """An authentication or authorization failure (SECURITY_ERROR_CODES)."""
    return exc.code in SECURITY_ERROR_CODES


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


# Each backoff is spread by up to this fraction either way (Kafka's KIP-580),
# so clients that failed together do not all retry in the same millisecond.
BACKOFF_JITTER = 0.2


def backoff_ms(attempt: int, *, base_ms: int, max_ms: int,
               rng: random.Random | None = None) -> int:
    """Exponential backoff with jitter (KIP-580): base, 2*base, 4*base, ...
    capped at max_ms (attempt >= 1), each times a random factor in
    [1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER]. `rng`: a seeded generator for
    reproducible runs (default: the module's)."""
    term_ms = min(max_ms, base_ms * (2 ** min(max(attempt - 1, 0), 20)))
    factor = (rng or _jitter_rng).uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
    return max(1, int(term_ms * factor))


_jitter_rng = random.Random()


# A retry loop sleeps no closer to its deadline than this, so its last attempt
# has time to get an answer (a Metadata answer takes about a millisecond).
LAST_ATTEMPT_MIN_S = 0.02

# Why a call reached no service of ours (transport_failure). SILENT is a
# process that accepts connections and never answers: paused (SIGSTOP), hung,
# or swamped; gRPC reports it as a connection that got no SETTINGS frame in
# time, or as a deadline that passed on a connection made earlier.
REFUSED = "connection refused"
SILENT = "no answer"
UNRESOLVED = "host name not found"
CONNECTION_FAILED = "connection failed"
# A client that never reached its cluster gives up this many rounds of
# refused connections on every address (quick retries with backoff, for a
# service still starting: about half a second), not its whole budget.
REFUSED_ROUNDS_BEFORE_FAILING = 4
# An address whose probe found nothing wrong is probed again no sooner than
# this (a service restarting closes connections too).
PROBE_INTERVAL_S = 5.0
# What a call expected to find at an address, when nothing more is known (the
# bootstrap addresses name partition stores, but a typo may name anything).
SERVICE = "oncelog service"


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A call that reached no service: why (REFUSED, SILENT, ...), and the
    service it expected to find there."""

    reason: str
    service: str = SERVICE


def transport_failure(exc: grpc.RpcError) -> str | None:
    """Why a failed call reached no service of ours (REFUSED, SILENT,
    UNRESOLVED, CONNECTION_FAILED); None when a service answered it, with our
    Error in the status or with any other status."""
    # Typed loosely, as _status reads it: the stubs and the runtime disagree.
    metadata: Iterable[Any] = (
        exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    ) or ()
    if any(key == STATUS_DETAILS_KEY for key, _value in metadata):
        return None
    code = exc.code() if hasattr(exc, "code") else None
    details = ((exc.details() if hasattr(exc, "details") else None) or "").lower()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return SILENT
    if code != grpc.StatusCode.UNAVAILABLE:
        return None
    if "refused" in details:
        return REFUSED
    if "settings frame" in details or "timed out" in details or "timeout" in details:
        return SILENT
    if "resolv" in details or "lookup" in details or "dns" in details:
        return UNRESOLVED
    return CONNECTION_FAILED


def remaining_ms(deadline_s: float) -> int:
    """Whole milliseconds left until a time.monotonic() deadline (0 once past it)."""
    return max(0, math.ceil((deadline_s - time.monotonic()) * 1000))


# Errors raised because no service answered, and the addresses they name: the
# CLI adds what to do about it (start a cluster, or point --bootstrap at one).
# Weak keys: an exception carries its addresses for as long as it lives.
_UNREACHABLE: weakref.WeakKeyDictionary[BaseException, tuple[str, ...]] = (
    weakref.WeakKeyDictionary()
)


def unreachable_addresses(exc: BaseException) -> tuple[str, ...]:
    """The addresses at which no service answered, when that is why `exc`
    was raised; empty for every other error."""
    try:
        return _UNREACHABLE.get(exc, ())
    except TypeError:  # a built-in exception (ValueError, ...): never one of ours
        return ()


def describe_unanswered(unanswered: Mapping[str, Unanswered], budget_ms: int) -> str:
    """One sentence saying that nothing answered, where and why, e.g.
    "no oncelog service answered at 127.0.0.1:9 within 1000 ms (connection
    refused) — is the cluster running?"."""
    silent = [f"the {what.service} at {address}" for address, what in unanswered.items()
              if what.reason == SILENT]
    others = {address: what for address, what in unanswered.items() if what.reason != SILENT}
    parts: list[str] = []
    if silent:
        parts.append(
            f"{', '.join(silent)} did not answer within {budget_ms} ms "
            f"(it accepts connections but sends nothing back: paused, hung or overloaded?)"
        )
    if others:
        services = {what.service for what in others.values()}
        reasons = {what.reason for what in others.values()}
        nothing = f"no {services.pop()}" if len(services) == 1 else "nothing"
        why = (reasons.pop() if len(reasons) == 1
               else "; ".join(f"{address}: {what.reason}" for address, what in others.items()))
        parts.append(f"{nothing} answered at {', '.join(others)} within {budget_ms} ms ({why})")
    sentence = "; ".join(parts)
    return sentence if silent else f"{sentence} — is the cluster running?"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as Metadata describes it."""

    name: str
    topic_id: int
    internal: bool
    # leaders[p] is the store node id that leads partition p (-1: none now).
    leaders: tuple[int, ...]
    config: Mapping[str, str]
    # Per partition: the leader epoch, every replica, the in-sync replicas.
    leader_epochs: tuple[int, ...] = ()
    replicas: tuple[tuple[int, ...], ...] = ()
    isr: tuple[tuple[int, ...], ...] = ()
    # A move in progress per partition: the replica list asked for (or ()).
    targets: tuple[tuple[int, ...], ...] = ()

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

    def leader_epoch(self, topic: str, partition: int) -> int | None:
        """The partition's leader epoch as this snapshot knows it; requests
        carry it so a replica can refuse a sender with stale metadata."""
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.leader_epochs):
            return None
        return info.leader_epochs[partition]

    @classmethod
    def from_proto(cls, resp: partition_store_pb2.MetadataResponse) -> ClusterMetadata:
        topics: dict[str, TopicInfo] = {}
        for t in resp.topics:
            if t.error.code != 0:
                continue
            count = len(t.partitions)
            leaders = [-1] * count
            epochs = [0] * count
            replicas: list[tuple[int, ...]] = [()] * count
            isr: list[tuple[int, ...]] = [()] * count
            targets: list[tuple[int, ...]] = [()] * count
            for p in t.partitions:
                if 0 <= p.partition < count:
                    leaders[p.partition] = p.leader_node_id
                    epochs[p.partition] = p.leader_epoch
                    replicas[p.partition] = tuple(p.replica_node_ids)
                    isr[p.partition] = tuple(p.isr_node_ids)
                    targets[p.partition] = tuple(p.target_replica_node_ids)
            topics[t.name] = TopicInfo(
                name=t.name, topic_id=t.topic_id, internal=t.internal,
                leaders=tuple(leaders), config=dict(t.config), leader_epochs=tuple(epochs),
                replicas=tuple(replicas), isr=tuple(isr), targets=tuple(targets),
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
        security: SecurityConfig | None = None,
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
        self.security = PLAINTEXT_CONFIG if security is None else security
        # address -> why it refuses this client's connections (_refused_connection).
        self._refusals: dict[str, str] = {}
        self._probed_at_s: dict[str, float] = {}
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
        # Never yet: the first request is never held back by the limit.
        self._last_background_refresh_s = float("-inf")
        # address -> (time.monotonic() of the failure, reason): calls that
        # reached no service, for the error that says so when a budget runs
        # out (see gave_up). An answer from the address removes it.
        self._unanswered: dict[str, tuple[float, Unanswered]] = {}
        # The address a Metadata request is waiting on now (under _refresh_lock).
        self._asking: str | None = None
        self._closed = False

    # ------------------------------------------------------------- channels

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("the client is closed")
            ch = self._channels.get(address)
            if ch is None:
                credentials = self.security.channel_credentials()
                ch = (grpc.insecure_channel(address, options=list(CHANNEL_OPTIONS))
                      if credentials is None else
                      grpc.secure_channel(address, credentials, options=list(CHANNEL_OPTIONS)))
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


    # ------------------------------------------------------------- failures

    def rpc_error(
        self, exc: grpc.RpcError, address: str, *, service: str = SERVICE
    ) -> OncelogError:
        """The typed exception for a failed call to `address`: as
        translate_rpc_error, except that a call that reached no service
        (transport_failure) says so in words and names the address and the
        service expected there, and is remembered for gave_up. The raw gRPC
        status stays reachable as the exception's __cause__."""
        translated = self.translate(exc)
        if translated.code is ErrorCode.SASL_AUTHENTICATION_FAILED:
            # A handshake or token failure: the service may have answered,
            # but not to us; say where.
            err = errors.error_for(translated.code, f"the {service} at {address}: "
                                                    f"{translated.message}")
            err.__cause__ = exc
            return err
        reason = transport_failure(exc)
        if reason is None:
            return translated
        details = ((exc.details() if hasattr(exc, "details") else None) or "").lower()
        refused = self._refused_connection(address, service) if (
            reason == CONNECTION_FAILED and "socket closed" in details) else None
        if refused is not None:
            err = errors.error_for(ErrorCode.SASL_AUTHENTICATION_FAILED, refused)
            err.__cause__ = exc
            return err
        self.note_unanswered(address, reason, service=service)
        phrase = "did not answer in time" if reason == SILENT else reason
        err = errors.error_for(translated.code, f"the {service} at {address}: {phrase}")
        err.__cause__ = exc
        return err

    def silent(self, address: str, *, service: str = SERVICE) -> OncelogError:
        """The error for a request that `address` did not answer before its
        deadline, remembered for gave_up as rpc_error remembers a unary
        call's DEADLINE_EXCEEDED (a request on a stream has no status)."""
        self.note_unanswered(address, SILENT, service=service)
        return errors.error_for(ErrorCode.REQUEST_TIMED_OUT,
                                f"the {service} at {address}: did not answer in time")

    def translate(self, exc: grpc.RpcError) -> OncelogError:
        """translate_rpc_error with this client's security settings."""
        return translate_rpc_error(exc, self.security)

    def _refused_connection(self, address: str, service: str) -> str | None:
        """Why a connection to `address` closed at once, when our security
        settings are why (probe_tls): a plain-text client at an address that
        serves TLS, or a TLS client without a certificate at one that
        requires it. None when the probe finds neither (the service may be
        restarting: the caller retries). Remembered per address."""
        known = self._refusals.get(address)
        if known is not None:
            return known
        if self.security.tls and self.security.certfile is not None:
            return None
        now_s = time.monotonic()
        if now_s - self._probed_at_s.get(address, -math.inf) < PROBE_INTERVAL_S:
            return None  # probed a moment ago, and it was not that
        self._probed_at_s[address] = now_s
        found = probe_tls(address)
        if not self.security.tls and found != PROBE_PLAIN:
            message = plaintext_to_tls_message(address, service)
        elif self.security.tls and found == PROBE_TLS_CLOSED:
            message = client_certificate_needed_message(address, service)
        else:
            return None
        self._refusals[address] = message
        return message

    def note_unanswered(self, address: str, reason: str, *, service: str = SERVICE) -> None:
        self._unanswered[address] = (time.monotonic(), Unanswered(reason, service))

    def note_answered(self, address: str) -> None:
        self._unanswered.pop(address, None)

    def unanswered_since(self, started_s: float) -> dict[str, Unanswered]:
        """Addresses whose latest call since `started_s` reached no service."""
        return {
            address: what for address, (at_s, what) in list(self._unanswered.items())
            if at_s >= started_s
        }

    def gave_up(
        self, what: str, budget_ms: int, started_s: float, last: OncelogError | None,
        *, name_what: bool = True,
    ) -> errors.KafkaTimeoutError:
        """The KafkaTimeoutError for a call (`what`, begun at started_s) whose
        budget ran out: when it failed for want of an answer, it says so in
        words and names the addresses (describe_unanswered), after "what: "
        unless name_what is False; else it names the last error. The last
        error is its __cause__."""
        unanswered = self.unanswered_since(started_s)
        transport = last is None or last.code in (
            ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT
        )
        if unanswered and transport:
            message = describe_unanswered(unanswered, budget_ms)
            if name_what:
                message = f"{what}: {message}"
            if isinstance(last, errors.KafkaTimeoutError) and last.message == message:
                return last  # an inner call that had the same budget said it already
            err = errors.KafkaTimeoutError(message)
            _UNREACHABLE[err] = tuple(unanswered)
        elif isinstance(last, errors.KafkaTimeoutError):
            return last  # already says what timed out
        elif last is None:
            err = errors.KafkaTimeoutError(f"{what} did not succeed within {budget_ms} ms")
        else:
            err = errors.KafkaTimeoutError(
                f"{what} did not succeed within {budget_ms} ms; last error: "
                f"{type(last).__name__}: {last.message or last.code.name}"
            )
        err.__cause__ = last
        return err

    # ------------------------------------------------------------- metadata

    def metadata(self, *, timeout_ms: int | None = None) -> ClusterMetadata:
        """The current snapshot, fetched on first use (and after
        invalidate_metadata) within timeout_ms, connecting included
        (default: request_timeout_ms); an old one is refreshed in the
        background while it keeps serving."""
        md = self._metadata
        if md is None or self._stale:
            return self.refresh_metadata(
                timeout_ms=self.request_timeout_ms if timeout_ms is None else timeout_ms
            )
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
        backoff, and returns or raises KafkaTimeoutError within timeout_ms,
        connecting and waiting for another thread's request included; without,
        tries each address once (up to request_timeout_ms each)."""
        started_s = time.monotonic()
        deadline_s = None if timeout_ms is None else started_s + timeout_ms / 1000
        version = self._metadata_version
        if deadline_s is None:
            self._refresh_lock.acquire()
        elif not self._refresh_lock.acquire(timeout=max(deadline_s - time.monotonic(), 0.0)):
            # Another thread's request has been waiting for an answer all this
            # time: the address it waits on did not answer within our budget,
            # and those it found silent or refusing before still count.
            now_s = time.monotonic()
            for address in self._metadata_addresses():
                known = self._unanswered.get(address)
                if known is not None:
                    self._unanswered[address] = (now_s, known[1])
            asking = self._asking
            if asking is not None:
                self.note_unanswered(asking, SILENT)
            raise self.gave_up(self._metadata_what(), timeout_ms or 0, started_s, None,
                               name_what=False)
        try:
            if self._metadata_version != version and self._metadata is not None:
                return self._metadata
            return self._refresh_locked(deadline_s, timeout_ms or 0, started_s)
        finally:
            self._refresh_lock.release()

    def _metadata_what(self) -> str:
        return f"Metadata from {', '.join(self._metadata_addresses())}"

    def _refresh_locked(
        self, deadline_s: float | None, budget_ms: int, started_s: float
    ) -> ClusterMetadata:
        attempt = 0
        refused_rounds = 0
        while True:
            attempt += 1
            attempt_started_s = time.monotonic()
            try:
                md = self._fetch_metadata_once(deadline_s)
            except OncelogError as exc:
                if deadline_s is None or self._closed or is_security_error(exc):
                    raise
                if self._metadata is None and self._all_refused(attempt_started_s):
                    # Never reached the cluster, and every address refuses
                    # the connection outright: nothing listens there (a
                    # wrong address, or the cluster is not running). Said
                    # at once, after a few quick tries for a service that is
                    # still starting, instead of after the whole budget.
                    refused_rounds += 1
                    if refused_rounds >= REFUSED_ROUNDS_BEFORE_FAILING:
                        tried_ms = round((time.monotonic() - started_s) * 1000)
                        # Not `from exc`: gave_up makes exc the cause.
                        raise self.gave_up(  # noqa: B904
                            self._metadata_what(), tried_ms, started_s, exc, name_what=False)
                else:
                    refused_rounds = 0
                pause_s = backoff_ms(
                    attempt, base_ms=self.retry_backoff_ms, max_ms=self.retry_backoff_max_ms
                ) / 1000
                left_s = deadline_s - time.monotonic()
                if left_s <= LAST_ATTEMPT_MIN_S:
                    # Not `from exc`: gave_up made exc the cause already, and may
                    # return an error that is exc itself.
                    raise self.gave_up(  # noqa: B904
                        self._metadata_what(), budget_ms, started_s, exc, name_what=False
                    )
                time.sleep(min(pause_s, left_s - LAST_ATTEMPT_MIN_S))
                continue
            self._metadata = md
            self._metadata_version += 1
            self._stale = False
            return md

    def _all_refused(self, since_s: float) -> bool:
        """Whether every address asked since `since_s` refused the
        connection or does not resolve (nothing listens there)."""
        unanswered = self.unanswered_since(since_s)
        addresses = self._metadata_addresses()
        return bool(addresses) and all(
            address in unanswered and unanswered[address].reason in (REFUSED, UNRESOLVED)
            for address in addresses)

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
        addresses = self._metadata_addresses()
        for index, address in enumerate(addresses):
            timeout_s = self.request_timeout_ms / 1000
            if deadline_s is not None:
                # What is left is shared among the addresses still to ask, so
                # one silent address cannot take all the time another one
                # would answer in (a refused one answers at once).
                left_s = deadline_s - time.monotonic()
                if left_s <= 0:
                    break
                timeout_s = min(timeout_s, left_s / (len(addresses) - index))
            self._asking = address
            try:
                resp = self.store(address).Metadata(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                last = self.rpc_error(exc, address)
                log.debug("Metadata from %s failed: %s", address, last)
                if is_security_error(last):
                    raise last from exc
                continue
            finally:
                self._asking = None
            self.note_answered(address)
            return ClusterMetadata.from_proto(resp)
        if last is None:
            last = errors.error_for(
                ErrorCode.REQUEST_TIMED_OUT, "no time left to ask for Metadata"
            )
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

    def topic(
        self, name: str, *, refresh_if_missing: bool = True, timeout_ms: int | None = None
    ) -> TopicInfo:
        """The topic's metadata; asks Metadata again once when it is not known
        (it may have been created since), then raises UnknownTopicOrPartitionError.

        timeout_ms bounds the whole call, connecting and waiting for another
        thread's Metadata request included: KafkaTimeoutError after it. None:
        up to request_timeout_ms for each of the two Metadata requests."""
        started_s = time.monotonic()
        if timeout_ms is None:
            info = self.metadata().topics.get(name)
            if info is None and refresh_if_missing:
                info = self.refresh_metadata(timeout_ms=self.request_timeout_ms).topics.get(name)
        else:
            deadline_s = started_s + timeout_ms / 1000
            try:
                info = self.metadata(timeout_ms=timeout_ms).topics.get(name)
                if info is None and refresh_if_missing:
                    info = self.refresh_metadata(
                        timeout_ms=remaining_ms(deadline_s)
                    ).topics.get(name)
            except errors.KafkaTimeoutError as exc:
                # The inner call names the time it had left; say the caller's.
                restated = self.gave_up(f"Metadata for topic {name!r}", timeout_ms, started_s, exc)
                if restated is exc:
                    raise
                raise restated from exc
        if info is None:
            left_ms = (self.request_timeout_ms if timeout_ms is None
                       else remaining_ms(started_s + timeout_ms / 1000))
            refusal = self.topic_refusal(name, timeout_ms=left_ms)
            if refusal is not None:
                raise refusal
            raise errors.error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            )
        return info

    def topic_refusal(self, name: str, *, timeout_ms: int) -> OncelogError | None:
        """Why Metadata leaves topic `name` out, when an ACL is why: a
        listing of every topic leaves out those the principal may not
        Describe, while a Metadata request naming the topic is answered
        TOPIC_AUTHORIZATION_FAILED (Kafka's rule: a name without Describe is
        not told whether it exists). Asked only over TLS (a plain-text
        client has no principal to refuse); None when the topic is not
        refused, or no answer came within timeout_ms."""
        if not self.security.tls or timeout_ms <= 0:
            return None
        request = partition_store_pb2.MetadataRequest(topics=[name], include_internal=True)
        deadline_s = time.monotonic() + timeout_ms / 1000
        for address in self._metadata_addresses():
            left_s = min(deadline_s - time.monotonic(), self.request_timeout_ms / 1000)
            if left_s <= 0:
                break
            try:
                resp = self.store(address).Metadata(request, timeout=left_s)
            except grpc.RpcError as exc:
                err = self.rpc_error(exc, address)
                if is_security_error(err):
                    return err
                continue
            self.note_answered(address)
            for t in resp.topics:
                found = error_from_proto(t.error) if t.name == name else None
                if found is not None and is_security_error(found):
                    return found
            return None
        return None

    def leader(self, topic: str, partition: int, *, timeout_ms: int | None = None) -> str:
        """The advertised address of the store that owns a partition
        (timeout_ms: as for topic())."""
        info = self.topic(topic, timeout_ms=timeout_ms)
        if not 0 <= partition < info.num_partitions:
            raise errors.error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has {info.num_partitions} partitions, no partition {partition}",
            )
        # The snapshot topic() just read (or a newer one): no second lookup.
        md = self._metadata
        address = None if md is None else md.stores.get(info.leaders[partition])
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
        timeout_ms (default: request_timeout_ms) has passed, then raises
        KafkaTimeoutError (see gave_up). Each attempt gets what is left of the
        budget (at most request_timeout_ms) as timeout_s, and must spend no
        more than that, metadata lookups included (pass it on as timeout_ms).

        attempt_fn raises grpc.RpcError or OncelogError; anything else passes
        through. UNKNOWN_TOPIC_OR_PARTITION is retried once, after a metadata
        refresh (the topic may be newer than our metadata).
        """
        budget_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        started_s = time.monotonic()
        deadline_s = started_s + budget_ms / 1000
        attempt = 0
        unknown_topic_retried = False
        exc: OncelogError | None = None
        while True:
            attempt += 1
            timeout_s = min(self.request_timeout_ms / 1000, deadline_s - time.monotonic())
            if timeout_s <= 0:
                raise self.gave_up(what, budget_ms, started_s, exc)
            try:
                return attempt_fn(timeout_s)
            except grpc.RpcError as rpc_exc:
                exc = self.translate(rpc_exc)
            except OncelogError as oncelog_exc:
                exc = oncelog_exc
            if exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not unknown_topic_retried:
                unknown_topic_retried = True
                self._refresh_quietly(deadline_s)
                continue
            if not exc.retriable:
                raise exc
            pause_s = backoff_ms(
                attempt, base_ms=self.retry_backoff_ms, max_ms=self.retry_backoff_max_ms
            ) / 1000
            left_s = deadline_s - time.monotonic()
            if left_s <= LAST_ATTEMPT_MIN_S:
                raise self.gave_up(what, budget_ms, started_s, exc)
            time.sleep(min(pause_s, left_s - LAST_ATTEMPT_MIN_S))
            if needs_metadata_refresh(exc):
                self._refresh_quietly(deadline_s)

    def _refresh_quietly(self, deadline_s: float) -> None:
        """A metadata refresh within what is left until deadline_s; a failure
        is left for the next attempt to run into."""
        left_ms = remaining_ms(deadline_s) - int(LAST_ATTEMPT_MIN_S * 1000)
        if left_ms <= 0:
            return
        try:
            self.refresh_metadata(timeout_ms=left_ms)
        except OncelogError as exc:
            log.debug("metadata refresh failed: %s", exc)
