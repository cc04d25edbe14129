"""Talking to a group's coordinator: committed offsets (shared by the
consumer and the admin) and the consumer's heartbeat thread.

The coordinator is found with FindCoordinator(group_id, GROUP) and cached by a
`CoordinatorLocator`; every call here looks it up again after NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE or a transport error.
Every blocking call returns or raises within the budget it is given;
`send_fetch` does not block on the answer at all (poll() collects it later).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc

from oncelog._client import ClusterClient, backoff_ms, error_from_proto, raise_for_error
from oncelog._coordinators import (
    GROUP,
    CoordinatorLocator,
    NoCoordinatorError,
    call_coordinator,
    call_coordinator_once,
    coordinator_failed,
)
from oncelog._membership import GroupMembership, HeartbeatAnswer, HeartbeatRequest
from oncelog.types import TopicPartition
from oncelog.v1 import errors_pb2, group_coordinator_pb2, records_pb2
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError

log = logging.getLogger("oncelog.group")

_T = TypeVar("_T")

# OffsetFetch(require_stable) answers UNSTABLE_OFFSET_COMMIT while a
# transactional offset waits for its transaction's marker, which lands
# milliseconds after the transaction ends: ask again soon.
UNSTABLE_OFFSET_BACKOFF_MS = 5
# OffsetCommit/OffsetFetch generation_id and member_id outside the group protocol.
NO_GENERATION = -1


def unstable_offset_backoff_ms(attempt: int, max_ms: int) -> int:
    """The pause before retry `attempt` (>= 1) after UNSTABLE_OFFSET_COMMIT."""
    return backoff_ms(attempt, base_ms=UNSTABLE_OFFSET_BACKOFF_MS,
                      max_ms=max(max_ms, UNSTABLE_OFFSET_BACKOFF_MS))


def check_group_id(group_id: object) -> str:
    if not isinstance(group_id, str) or not group_id:
        raise ValueError(f"group_id must be a non-empty str, got {group_id!r}")
    return group_id


def check_offsets(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Offsets to commit, checked before anything is sent."""
    out: dict[TopicPartition, int] = {}
    for tp, offset in offsets.items():
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"offsets must be keyed by TopicPartition, got {tp!r}")
        if type(offset) is not int or offset < 0:
            raise ValueError(
                f"the offset to commit for {tp.topic}-{tp.partition} must be an int >= 0 "
                f"(the next offset to read), got {offset!r}"
            )
        out[tp] = offset
    return out


@dataclass(frozen=True, slots=True)
class OffsetFetchResult:
    """One OffsetFetch attempt: committed offsets (-1: none) and the partitions
    whose offset is not stable yet (a transactional offset is pending)."""

    offsets: dict[TopicPartition, int]
    unstable: frozenset[TopicPartition]


class GroupClient:
    """Calls to one group's coordinator: OffsetCommit and OffsetFetch here,
    any other through `call`."""

    def __init__(self, client: ClusterClient, group_id: str) -> None:
        self.client = client
        self.group_id = group_id
        self.locator = CoordinatorLocator(client, group_id, GROUP)

    def call(self, what: str, attempt: Callable[[str, float], _T], *, budget_ms: int) -> _T:
        """attempt(address, timeout_s) at the group's coordinator, with retries."""
        return call_coordinator(self.client, self.locator, f"{what} of group {self.group_id!r}",
                                attempt, budget_ms=budget_ms)

    def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        *,
        generation_id: int,
        member_id: str,
        budget_ms: int,
    ) -> None:
        """OffsetCommit; raises the first partition's error (naming it)."""
        if not offsets:
            return
        request = group_coordinator_pb2.OffsetCommitRequest(
            group_id=self.group_id, generation_id=generation_id, member_id=member_id,
            partitions=[
                group_coordinator_pb2.OffsetCommitPartition(
                    topic=tp.topic, partition=tp.partition, offset=offset,
                )
                for tp, offset in sorted(offsets.items())
            ],
        )

        def attempt(address: str, timeout_s: float) -> None:
            resp = self.client.group_coordinator(address).OffsetCommit(
                request, timeout=timeout_s
            )
            raise_partition_errors(resp.error, resp.results)

        self.call("OffsetCommit", attempt, budget_ms=budget_ms)

    def fetch_once(
        self,
        partitions: Iterable[TopicPartition] | None,
        *,
        require_stable: bool,
        timeout_s: float,
    ) -> OffsetFetchResult:
        """One OffsetFetch at the cached coordinator (found first if need be);
        partitions None: every partition with a committed offset. Raises
        OncelogError (retriable ones included) for the caller to sort."""
        tps = None if partitions is None else sorted(set(partitions))
        request = group_coordinator_pb2.OffsetFetchRequest(
            group_id=self.group_id, require_stable=require_stable,
            partitions=[
                records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                for tp in tps or ()
            ],
        )

        def attempt(address: str, attempt_timeout_s: float) -> OffsetFetchResult:
            resp = self.client.group_coordinator(address).OffsetFetch(
                request, timeout=attempt_timeout_s
            )
            raise_for_error(resp.error)
            return self._fetch_result(resp, tps)

        try:
            return call_coordinator_once(self.client, self.locator, attempt, timeout_s)
        except NoCoordinatorError as none:
            raise none.error from None

    def send_fetch(
        self,
        partitions: Iterable[TopicPartition],
        *,
        require_stable: bool,
        timeout_s: float,
        lookup_timeout_s: float,
    ) -> PendingOffsetFetch:
        """Sends one OffsetFetch and returns without waiting for its answer
        (poll() must not wait longer than its timeout; Kafka's consumer keeps
        such a request pending across polls too). Finding the coordinator,
        when it is not cached, blocks for up to lookup_timeout_s. Raises
        OncelogError (retriable ones included) when it cannot be sent."""
        tps = sorted(set(partitions))
        request = group_coordinator_pb2.OffsetFetchRequest(
            group_id=self.group_id, require_stable=require_stable,
            partitions=[
                records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                for tp in tps
            ],
        )
        address = self.locator.address
        try:
            if address is None:
                address = self.locator.lookup(lookup_timeout_s)
        except OncelogError as exc:
            coordinator_failed(self.client, self.locator, None, exc)
            raise
        except NoCoordinatorError as none:
            raise none.error from None
        call = self.client.group_coordinator(address).OffsetFetch.future(
            request, timeout=timeout_s
        )
        return PendingOffsetFetch(self, tps, address, call)

    def _fetch_result(self, resp: group_coordinator_pb2.OffsetFetchResponse,
                      wanted: list[TopicPartition] | None) -> OffsetFetchResult:
        offsets: dict[TopicPartition, int] = {}
        unstable: set[TopicPartition] = set()
        for p in resp.partitions:
            tp = TopicPartition(p.topic, p.partition)
            exc = error_from_proto(p.error)
            if exc is None:
                offsets[tp] = p.offset
            elif exc.code is ErrorCode.UNSTABLE_OFFSET_COMMIT:
                unstable.add(tp)
            else:
                raise errors.error_for(
                    exc.code, f"OffsetFetch of group {self.group_id!r} for "
                    f"{p.topic}-{p.partition}: {exc.message or exc.code.name}",
                )
        for tp in wanted or ():
            if tp not in offsets and tp not in unstable:
                offsets[tp] = -1  # an answer that leaves a partition out: nothing committed
        return OffsetFetchResult(offsets, frozenset(unstable))

    def fetch(
        self,
        partitions: Iterable[TopicPartition] | None,
        *,
        budget_ms: int,
        require_stable: bool = True,
    ) -> dict[TopicPartition, int]:
        """Committed offsets (-1: none), asking again while some are unstable
        (shortly) or the coordinator moved (with backoff), for up to budget_ms."""
        found: dict[TopicPartition, int] = {}
        pending = None if partitions is None else set(partitions)
        unstable_attempts = 0
        deadline_s = time.monotonic() + budget_ms / 1000

        def attempt(_address: str, timeout_s: float) -> dict[TopicPartition, int]:
            nonlocal pending, unstable_attempts
            # The asks below share this attempt's time.
            attempt_deadline_s = time.monotonic() + timeout_s
            while True:
                left_s = attempt_deadline_s - time.monotonic()
                if left_s <= 0:
                    raise errors.error_for(
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"OffsetFetch of group {self.group_id!r} ran out of time",
                    )
                result = self.fetch_once(pending, require_stable=require_stable,
                                         timeout_s=left_s)
                found.update(result.offsets)
                if not result.unstable:
                    return found
                pending = set(result.unstable)
                unstable_attempts += 1
                pause_ms = unstable_offset_backoff_ms(unstable_attempts,
                                                      self.client.retry_backoff_ms)
                if time.monotonic() + pause_ms / 1000 >= deadline_s:
                    raise errors.error_for(
                        ErrorCode.UNSTABLE_OFFSET_COMMIT,
                        f"a transactional offset of {partition_names(result.unstable)} "
                        "is still pending",
                    )
                time.sleep(pause_ms / 1000)

        return self.call("OffsetFetch", attempt, budget_ms=budget_ms)


class PendingOffsetFetch:
    """An OffsetFetch sent by GroupClient.send_fetch, not yet waited for."""

    def __init__(self, group: GroupClient, partitions: list[TopicPartition], address: str,
                 call: grpc.Future) -> None:
        self._group = group
        self.partitions = frozenset(partitions)
        self._address = address
        self._call = call

    def done(self) -> bool:
        return bool(self._call.done())

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """callback() once the answer is in (on a gRPC thread: keep it short)."""
        self._call.add_done_callback(lambda _call: callback())

    def cancel(self) -> None:
        self._call.cancel()

    def result(self) -> OffsetFetchResult:
        """The answer of a done() fetch; raises OncelogError, retriable ones
        included (after one that says the coordinator may have moved, the
        next call looks it up again)."""
        group = self._group
        try:
            resp = self._call.result(timeout=0)
            raise_for_error(resp.error)
            return group._fetch_result(resp, sorted(self.partitions))
        except grpc.FutureCancelledError:
            exc = errors.error_for(ErrorCode.NETWORK_EXCEPTION, "the OffsetFetch was cancelled")
        except grpc.RpcError as rpc_exc:
            exc = group.client.rpc_error(rpc_exc, self._address,
                                         service=group.locator.service)
        except OncelogError as oncelog_exc:
            exc = oncelog_exc
        coordinator_failed(group.client, group.locator, self._address, exc)
        raise exc


def raise_partition_errors(
    error: errors_pb2.Error, results: Iterable[group_coordinator_pb2.OffsetPartitionResult]
) -> None:
    """Raises the request's error, else the first partition's (naming it)."""
    raise_for_error(error)
    for result in results:
        exc = error_from_proto(result.error)
        if exc is not None:
            raise errors.error_for(
                exc.code, f"{result.topic}-{result.partition}: {exc.message or exc.code.name}"
            )


def partition_names(tps: Iterable[TopicPartition]) -> str:
    """"t-0, t-1": partitions as logs and messages name them."""
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


class HeartbeatThread:
    """Sends the member's heartbeats from a background thread.

    The thread asks the membership (under the consumer's lock) what to send,
    sends it without the lock, and hands the answer back under the lock; then
    it wakes the application's poll() (`on_change`), which applies new
    assignments. `wake()` makes it look again at once (after poll() applied a
    plan, or close() asked to leave).
    """

    def __init__(
        self,
        group: GroupClient,
        membership: GroupMembership,
        lock: threading.Lock,
        on_change: Callable[[], None],
        *,
        request_timeout_ms: int,
    ) -> None:
        self._client = group.client
        self._locator = group.locator
        self._membership = membership
        self._wakeup = threading.Condition(lock)
        self._on_change = on_change
        self._request_timeout_ms = request_timeout_ms
        self._stopped = False
        self._failures = 0
        self.thread = threading.Thread(
            target=self._run, name=f"oncelog-heartbeat-{membership.group_id}", daemon=True
        )
        self.thread.start()

    def wake(self) -> None:
        """Look at the membership again now. Caller holds the lock."""
        self._wakeup.notify_all()

    def stop(self) -> None:
        """Sends nothing more; a heartbeat in flight ends with the client's
        channels (close them, then join())."""
        with self._wakeup:
            self._stopped = True
            self._wakeup.notify_all()

    def join(self, timeout_s: float) -> None:
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # pragma: no cover - a bug; keep its trace visible
            log.exception("heartbeat thread of group %r crashed", self._membership.group_id)
            with self._wakeup:
                # Without heartbeats the member is as good as gone: poll() raises.
                self._membership.fail(errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR, f"the heartbeat thread crashed: {exc!r}"
                ))
                self._on_change()

    def _loop(self) -> None:
        membership = self._membership
        while True:
            with self._wakeup:
                if self._stopped:
                    return
                now = now_ms()
                before = membership.state
                membership.check_session(now)
                if membership.state is not before:
                    log.warning("group %r: %s", membership.group_id, membership.error)
                    self._on_change()
                request = membership.next_request(now)
                if request is None:
                    wait_ms = membership.wait_ms(now)
                    self._wakeup.wait(None if wait_ms is None else max(wait_ms, 1) / 1000)
                    continue
            sent_ms = now_ms()
            fatal = False
            try:
                answer = self._send(request)
            except OncelogError as failed:
                answer, exc = None, failed
            except NoCoordinatorError as none:
                # The cluster has no group coordinator at all: waiting cannot help.
                answer, exc, fatal = None, none.error, True
            with self._wakeup:
                now = now_ms()
                if answer is not None:
                    self._failures = 0
                    membership.on_response(request, answer, sent_ms, now)
                else:
                    self._failures += 1
                    retry_after_ms = backoff_ms(
                        self._failures, base_ms=self._client.retry_backoff_ms,
                        max_ms=self._client.retry_backoff_max_ms,
                    )
                    log.debug("group %r: %s heartbeat failed: %s", membership.group_id,
                              request.kind.value, exc)
                    membership.on_error(request, exc, now, retry_after_ms=retry_after_ms,
                                        fatal=fatal)
                self._on_change()

    def _send(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        """One heartbeat; raises OncelogError or NoCoordinatorError."""
        proto = group_coordinator_pb2.ConsumerGroupHeartbeatRequest(
            group_id=self._membership.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            group_instance_id=request.group_instance_id or "",
            session_timeout_ms=request.session_timeout_ms,
            subscribed_topics=list(request.subscribed_topics),
            owned_partitions=[
                records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                for tp in request.owned_partitions
            ],
        )
        # A heartbeat stuck longer than a session is worthless: by then the
        # coordinator has removed the member anyway.
        timeout_s = min(self._request_timeout_ms, request.session_timeout_ms) / 1000

        def attempt(address: str, attempt_timeout_s: float) -> HeartbeatAnswer:
            resp = self._client.group_coordinator(address).ConsumerGroupHeartbeat(
                proto, timeout=attempt_timeout_s
            )
            raise_for_error(resp.error)
            return HeartbeatAnswer(
                member_id=resp.member_id,
                member_epoch=resp.member_epoch,
                heartbeat_interval_ms=resp.heartbeat_interval_ms,
                assignment=frozenset(
                    TopicPartition(tp.topic, tp.partition) for tp in resp.assignment
                ) if resp.has_assignment else None,
            )

        return call_coordinator_once(self._client, self._locator, attempt, timeout_s)


def now_ms() -> int:
    """Milliseconds of the monotonic clock (membership deadlines)."""
    return int(time.monotonic() * 1000)
