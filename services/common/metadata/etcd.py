"""EtcdMetadataStore: the metadata store port (services/common/metadata/store.py)
over etcd v3.

It speaks etcd's v3 gRPC API through the protobuf modules and stubs that the
`aetcd` package ships (`aetcd.rpc`), on grpc.aio channels of its own, rather
than through `aetcd.Client`, for three reasons found while testing against
etcd 3.4: a Client talks to one endpoint; its timeout is one number of
seconds per client, not a deadline per call; and its watch hands out events
one at a time, so a consumer would see a multi-key transaction half applied.

Endpoints and fail-over. One channel per endpoint ("host:port"), made on
first use. A call starts at the endpoint that answered last and moves to the
next one (in the order given, wrapping round) when an endpoint is not
connected — refused, still connecting after its share of the time left, or
in reconnect backoff — or when it fails with a status that says this member
cannot serve now (UNAVAILABLE: "no leader", "request timed out"; a dead
connection; DEADLINE_EXCEEDED). It keeps going round, pausing briefly after
each round in which every endpoint failed, until the call's deadline.
etcd's own clients fail over the same way. A channel's reconnect backoff is
at most 1 s, so a restarted member is used again within about a second.

Deadlines. Every call, fail-over included, returns within `timeout_ms` (plus
scheduling slack): then it raises MetadataUnavailable naming every endpoint
and the last failure at each.
* Reads and the lease calls (get, get_prefix, grant_lease, keep_alive,
  revoke) are repeated at the next endpoint after any such failure; an
  attempt gets half the time left when there are several endpoints, so a
  member that accepts connections but does not answer (SIGSTOP, a partition)
  costs half the budget, not all of it. (A repeated grant_lease may leave an
  unused lease behind; it expires after its TTL.)
* `commit` is repeated only while nothing was sent (no endpoint connected).
  Once sent, a failure raises MetadataUnavailable(maybe_applied=True) and
  the next call starts at the next endpoint: a repeated transaction whose
  first copy was applied would fail its own compares and report a loss
  that was a win. The caller re-reads and decides.
* A watch is a long-lived stream with no deadline; when it breaks it is made
  again (at another member when its own cannot serve) from the revision
  after the last one delivered, within `timeout_ms`, else the iterator raises
  MetadataUnavailable. The stream asks etcd to end it when its member loses
  the leader ("hasleader"). A member that stops answering altogether
  (SIGSTOP, a partition) is noticed by gRPC keepalive: a ping after 10 s
  without traffic (etcd refuses pings more often than every 5 s), answered
  within 5 s or the connection ends; so such a watch moves to another member
  after about 15 s (measured: 14.9 s), with nothing lost.

Status mapping (`classify_status`, pure): INVALID_ARGUMENT -> ValueError (a
bug of ours: the shared checks in metadata/store.py catch it before sending);
NOT_FOUND "requested lease not found" -> LeaseNotFound (revoke: already
gone); OUT_OF_RANGE "compacted" -> WatchCompacted; UNAVAILABLE,
DEADLINE_EXCEEDED, UNKNOWN, INTERNAL, CANCELLED (by the network) -> try
another member; anything else (no space, auth) -> MetadataUnavailable at
once, nothing applied.

Use one EtcdMetadataStore from one event loop (its channels belong to the
loop that first used them).
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from aetcd import rpc as etcd_rpc  # type: ignore[import-untyped]

from oncelog.wire.limits import CHANNEL_OPTIONS

from .store import (
    Compare,
    LeaseNotFound,
    MetadataUnavailable,
    Put,
    Versioned,
    WatchCompacted,
    WatchEvent,
    check_key,
    check_start_revision,
    check_ttl,
    check_txn,
)

T = TypeVar("T")

# Keys per Range request of get_prefix; later pages are read at the first
# page's revision, so the result is one snapshot however many pages it takes.
GET_PREFIX_PAGE_KEYS = 1000
# How long a call waits after a round in which every endpoint failed before
# it tries again (a member coming back, a backoff ending, a leader elected).
ROUND_PAUSE_S = 0.05

_ETCD_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    *CHANNEL_OPTIONS,
    # Pings while a call (a watch) is open, so a member that stopped
    # answering is noticed; etcd refuses pings more often than every 5 s
    # (--grpc-keepalive-min-time) and then closes the connection.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # What ends the connection when a ping gets no answer: with grpc 1.85,
    # keepalive_timeout_ms alone left a watch on a stopped member hanging.
    ("grpc.http2.ping_timeout_ms", 5_000),
    # Keep pinging on a quiet watch stream (gRPC stops after 2 pings without data).
    ("grpc.http2.max_pings_without_data", 0),
)
# What a stream's read() returns at its end (grpc-stubs does not declare it).
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]
# etcd ends a stream with this metadata when its member has no leader
# (clientv3's WithRequireLeader), instead of keeping it silent.
_REQUIRE_LEADER = (("hasleader", "true"),)


class EtcdFailure(enum.Enum):
    """What an etcd status means for the call that got it."""

    # This member cannot serve now; another one may. A write sent may have happened.
    TRY_ANOTHER = "try_another"
    # The request is wrong (a bug): ValueError.
    INVALID = "invalid"
    LEASE_NOT_FOUND = "lease_not_found"
    COMPACTED = "compacted"
    # The cluster refuses (no space, auth): MetadataUnavailable, nothing applied.
    REFUSED = "refused"


_TRY_ANOTHER_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED,
})


def classify_status(code: grpc.StatusCode, details: str) -> EtcdFailure:
    """Pure: the meaning of a status that etcd (or the channel) ended a call with."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return EtcdFailure.INVALID
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return EtcdFailure.LEASE_NOT_FOUND
    if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
        return EtcdFailure.COMPACTED
    if code in _TRY_ANOTHER_CODES:
        return EtcdFailure.TRY_ANOTHER
    return EtcdFailure.REFUSED


def parse_endpoints(text: str) -> tuple[str, ...]:
    """ "host:port,host:port" (a flag's or ONCELOG_ETCD_ENDPOINTS' value) as
    a tuple, each endpoint checked."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    for endpoint in endpoints:
        _check_endpoint(endpoint)
    return endpoints


def _check_endpoint(endpoint: str) -> None:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or "/" in endpoint or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise ValueError(f"etcd endpoint {endpoint!r}: expected host:port "
                         f"(no scheme), e.g. 127.0.0.1:2379")


def prefix_range_end(prefix: bytes) -> bytes:
    """The end of etcd's range for every key starting with prefix: the
    prefix with its last byte below 0xff incremented (b"\\0", i.e. "to the
    end", for an empty or all-0xff prefix)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _prefix_range(prefix: str) -> tuple[bytes, bytes]:
    # etcd reads "from key \0 to end \0" as every key.
    key = prefix.encode() or b"\0"
    return key, prefix_range_end(prefix.encode())


class _Unanswered(Exception):
    """A stream ended without the reply it owed (counts as TRY_ANOTHER)."""


class EtcdMetadataStore:
    """The metadata store port over an etcd cluster (module docstring)."""

    def __init__(self, endpoints: Sequence[str], *, timeout_ms: int) -> None:
        if isinstance(endpoints, str):
            raise TypeError("endpoints is a sequence of 'host:port' strings, not one string "
                            "(parse_endpoints splits a comma-separated one)")
        self._endpoints = tuple(endpoints)
        if not self._endpoints:
            raise ValueError("EtcdMetadataStore needs at least one endpoint")
        for endpoint in self._endpoints:
            _check_endpoint(endpoint)
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms {timeout_ms}; expected > 0")
        self._timeout_ms = timeout_ms
        self._channels: dict[int, grpc.aio.Channel] = {}
        # Where the next call starts: the endpoint that answered last.
        self._current = 0
        self._closed = False
        self._watch_calls: set[Any] = set()

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    # ----------------------------------------------------------- plumbing

    def _channel(self, index: int) -> grpc.aio.Channel:
        channel = self._channels.get(index)
        if channel is None:
            channel = grpc.aio.insecure_channel(self._endpoints[index],
                                                options=_ETCD_CHANNEL_OPTIONS)
            self._channels[index] = channel
        return channel

    def _unavailable(self, what: str, failures: dict[str, str], *,
                     maybe_applied: bool = False) -> MetadataUnavailable:
        tried = "; ".join(f"{endpoint}: {failures.get(endpoint, 'not tried')}"
                          for endpoint in self._endpoints)
        applied = " (it was sent: it may have been applied)" if maybe_applied else ""
        return MetadataUnavailable(
            f"etcd at {', '.join(self._endpoints)} did not answer {what} within "
            f"{self._timeout_ms} ms{applied}: {tried}",
            endpoints=self._endpoints, maybe_applied=maybe_applied,
        )

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise MetadataUnavailable(
                f"{what}: the metadata store client for {', '.join(self._endpoints)} is closed",
                endpoints=self._endpoints)

    async def _connected(self, channel: grpc.aio.Channel, wait_s: float) -> bool:
        """Whether the channel is (or within wait_s becomes) connected. False
        at once for one that failed to connect and is in backoff."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         grpc.ChannelConnectivity.SHUTDOWN):
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
            except TimeoutError:
                return False
            state = channel.get_state(try_to_connect=True)
        return True

    async def _call(self, what: str,
                    attempt: Callable[[grpc.aio.Channel, float], Awaitable[T]], *,
                    repeatable: bool) -> T:
        """Runs attempt(channel, timeout_s) at one endpoint after another
        until one answers or the deadline passes (module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_ms / 1000
        count = len(self._endpoints)
        start = self._current
        failures: dict[str, str] = {}
        tries = 0
        while (remaining := deadline - loop.time()) > 0:
            self._check_open(what)  # close() during the call: no new channels
            index = (start + tries) % count
            untried_this_round = count - tries % count
            tries += 1
            endpoint = self._endpoints[index]
            channel = self._channel(index)
            if not await self._connected(channel, remaining / untried_this_round):
                failures[endpoint] = "not connected"
            else:
                remaining = deadline - loop.time()
                timeout_s = remaining / 2 if repeatable and count > 1 else remaining
                try:
                    result = await attempt(channel, max(timeout_s, 0.001))
                except (grpc.aio.AioRpcError, _Unanswered) as exc:
                    if isinstance(exc, _Unanswered):
                        failure, detail = EtcdFailure.TRY_ANOTHER, str(exc)
                    else:
                        failure = classify_status(exc.code(), exc.details() or "")
                        detail = f"{exc.code().name} {exc.details()}"
                    self._raise_definite(failure, what, detail)
                    failures[endpoint] = detail
                    self._current = (index + 1) % count
                    if failure is EtcdFailure.REFUSED:
                        raise MetadataUnavailable(
                            f"etcd at {endpoint} refused {what}: {detail}",
                            endpoints=self._endpoints) from exc
                    if not repeatable:
                        raise self._unavailable(what, failures, maybe_applied=True) from exc
                else:
                    self._current = index
                    return result
            if tries % count == 0:
                # Every endpoint failed this round: give a member a moment to
                # come back (or a backoff to end) before the next round.
                await asyncio.sleep(max(0.0, min(ROUND_PAUSE_S, deadline - loop.time())))
        raise self._unavailable(what, failures)

    @staticmethod
    def _raise_definite(failure: EtcdFailure, what: str, detail: str) -> None:
        """Raises for the failures that another endpoint would not change."""
        if failure is EtcdFailure.INVALID:
            raise ValueError(f"etcd refused {what} as invalid: {detail}")
        if failure is EtcdFailure.COMPACTED:
            raise RuntimeError(f"{what}: {detail}")  # reads are never at old revisions

    # --------------------------------------------------------------- port

    async def get(self, key: str) -> Versioned | None:
        check_key(key)

        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> Versioned | None:
            response = await etcd_rpc.KVStub(channel).Range(
                etcd_rpc.RangeRequest(key=key.encode()), timeout=timeout_s)
            if not response.kvs:
                return None
            kv = response.kvs[0]
            return Versioned(kv.value.decode(), kv.mod_revision)

        return await self._call(f"get {key!r}", attempt, repeatable=True)

    async def get_prefix(self, prefix: str) -> tuple[dict[str, Versioned], int]:
        key, range_end = _prefix_range(prefix)

        async def attempt(channel: grpc.aio.Channel,
                          timeout_s: float) -> tuple[dict[str, Versioned], int]:
            stub = etcd_rpc.KVStub(channel)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            found: dict[str, Versioned] = {}
            revision = 0
            start = key
            while True:
                try:
                    response = await stub.Range(
                        etcd_rpc.RangeRequest(key=start, range_end=range_end,
                                              limit=GET_PREFIX_PAGE_KEYS, revision=revision),
                        timeout=max(deadline - loop.time(), 0.001))
                except grpc.aio.AioRpcError as exc:
                    # Compacted between two pages: start again at the newest revision.
                    if revision and classify_status(exc.code(), exc.details() or "") \
                            is EtcdFailure.COMPACTED:
                        found, revision, start = {}, 0, key
                        continue
                    raise
                revision = revision or response.header.revision
                for kv in response.kvs:
                    found[kv.key.decode()] = Versioned(kv.value.decode(), kv.mod_revision)
                if not response.more or not response.kvs:
                    return found, revision
                start = response.kvs[-1].key + b"\0"

        return await self._call(f"get_prefix {prefix!r}", attempt, repeatable=True)

    async def commit(self, compares: Sequence[Compare], puts: Sequence[Put],
                     deletes: Sequence[str]) -> bool:
        check_txn(compares, puts, deletes)
        request = etcd_rpc.TxnRequest(
            compare=[
                etcd_rpc.Compare(key=c.key.encode(), target=etcd_rpc.Compare.MOD,
                                 result=etcd_rpc.Compare.EQUAL, mod_revision=c.mod_revision)
                for c in compares
            ],
            success=[
                *(etcd_rpc.RequestOp(request_put=etcd_rpc.PutRequest(
                    key=p.key.encode(), value=p.value.encode(), lease=p.lease or 0))
                  for p in puts),
                *(etcd_rpc.RequestOp(request_delete_range=etcd_rpc.DeleteRangeRequest(
                    key=key.encode()))
                  for key in deletes),
            ],
        )

        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> bool:
            try:
                response = await etcd_rpc.KVStub(channel).Txn(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                if classify_status(exc.code(), exc.details() or "") \
                        is EtcdFailure.LEASE_NOT_FOUND:
                    raise LeaseNotFound(p.lease for p in puts if p.lease) from exc
                raise
            return bool(response.succeeded)

        return await self._call("commit", attempt, repeatable=False)

    async def grant_lease(self, ttl_s: int) -> int:
        check_ttl(ttl_s)

        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> int:
            response = await etcd_rpc.LeaseStub(channel).LeaseGrant(
                etcd_rpc.LeaseGrantRequest(TTL=ttl_s), timeout=timeout_s)
            if response.error or response.ID <= 0:
                raise MetadataUnavailable(
                    f"etcd refused a lease of {ttl_s} s: {response.error or 'no id'}",
                    endpoints=self._endpoints)
            return int(response.ID)

        return await self._call(f"grant_lease {ttl_s} s", attempt, repeatable=True)

    async def keep_alive(self, lease_id: int) -> bool:
        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> bool:
            call = etcd_rpc.LeaseStub(channel).LeaseKeepAlive(
                iter([etcd_rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=timeout_s)
            try:
                async for response in call:
                    # TTL 0: etcd no longer knows the lease.
                    return bool(response.TTL > 0)
            finally:
                call.cancel()
            raise _Unanswered("the keep-alive stream ended without a reply")

        if lease_id <= 0:
            return False
        return await self._call(f"keep_alive {lease_id}", attempt, repeatable=True)

    async def revoke(self, lease_id: int) -> None:
        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> None:
            try:
                await etcd_rpc.LeaseStub(channel).LeaseRevoke(
                    etcd_rpc.LeaseRevokeRequest(ID=lease_id), timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                if classify_status(exc.code(), exc.details() or "") \
                        is not EtcdFailure.LEASE_NOT_FOUND:
                    raise

        if lease_id > 0:
            await self._call(f"revoke {lease_id}", attempt, repeatable=True)

    async def watch_prefix(self, prefix: str, *,
                           start_revision: int) -> AsyncGenerator[list[WatchEvent], None]:
        check_start_revision(start_revision)
        what = f"watch {prefix!r}"
        key, range_end = _prefix_range(prefix)
        next_revision = start_revision
        reconnecting = False
        while True:
            if reconnecting:
                # A stream that breaks at once again must not spin.
                await asyncio.sleep(ROUND_PAUSE_S)
            reconnecting = True
            try:
                call = await self._call(
                    what,
                    functools.partial(self._open_watch, key=key, range_end=range_end,
                                      start_revision=next_revision),
                    repeatable=True)
            except MetadataUnavailable:
                if self._closed:
                    return
                raise
            self._watch_calls.add(call)
            try:
                while True:
                    try:
                        response = await call.read()
                    except grpc.aio.AioRpcError as exc:
                        if self._closed:
                            return
                        failure = classify_status(exc.code(), exc.details() or "")
                        if failure is EtcdFailure.COMPACTED:
                            raise WatchCompacted(next_revision, 0) from exc
                        if failure is not EtcdFailure.TRY_ANOTHER:
                            raise MetadataUnavailable(
                                f"etcd ended {what}: {exc.code().name} {exc.details()}",
                                endpoints=self._endpoints) from exc
                        break  # the member died or lost the leader: watch elsewhere
                    except asyncio.CancelledError:
                        task = asyncio.current_task()
                        if self._closed and not (task and task.cancelling()):
                            return
                        raise
                    if response is _EOF or response.canceled:
                        # etcd ended the watch (its member lost the leader, say):
                        # make it again, at another member if this one cannot.
                        if response is not _EOF and response.compact_revision:
                            raise WatchCompacted(next_revision,
                                                 int(response.compact_revision))
                        break
                    if response.events:
                        batch = [
                            WatchEvent(
                                event.kv.key.decode(),
                                None if event.type == etcd_rpc.Event.DELETE
                                else event.kv.value.decode(),
                                int(event.kv.mod_revision),
                            )
                            for event in response.events
                        ]
                        next_revision = batch[-1].mod_revision + 1
                        yield batch
            finally:
                self._watch_calls.discard(call)
                call.cancel()

    async def _open_watch(self, channel: grpc.aio.Channel, timeout_s: float, *, key: bytes,
                          range_end: bytes, start_revision: int) -> Any:
        """A watch stream at one member, once etcd confirmed it (created)."""
        call = etcd_rpc.WatchStub(channel).Watch(metadata=_REQUIRE_LEADER)
        try:
            await asyncio.wait_for(call.write(etcd_rpc.WatchRequest(
                create_request=etcd_rpc.WatchCreateRequest(
                    key=key, range_end=range_end, start_revision=start_revision))),
                timeout_s)
            response = await asyncio.wait_for(call.read(), timeout_s)
        except TimeoutError as exc:
            call.cancel()
            raise _Unanswered(f"no answer to the watch request within "
                              f"{timeout_s * 1000:.0f} ms") from exc
        except BaseException:
            call.cancel()
            raise
        if response is _EOF or not response.created:
            call.cancel()
            raise _Unanswered("the watch stream ended before the watch was created")
        if response.compact_revision:
            call.cancel()
            raise WatchCompacted(start_revision, int(response.compact_revision))
        if response.canceled:
            call.cancel()
            raise _Unanswered(f"etcd cancelled the watch: {response.cancel_reason}")
        return call

    async def close(self) -> None:
        self._closed = True
        for call in list(self._watch_calls):
            call.cancel()
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(grace=None)
