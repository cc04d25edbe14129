"""Finding a transactional id's or a group's coordinator, and calling it with
retries.

`FindCoordinator(key, type)` is answered by any transaction coordinator (the
placement is a pure function of the cluster layout), so a `CoordinatorLocator`
asks the coordinators Metadata lists, in turn, and caches the address until a
call says the coordinator moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS, a transport error). `call_coordinator` is the
blocking retry loop the producer's transactional calls and the admin share.

Budgets cover whole calls: a lookup (metadata included) and the call after it
share one attempt's time, and `call_coordinator` returns or raises within its
budget_ms; a call that no coordinator answered raises a KafkaTimeoutError
that names the addresses (`ClusterClient.gave_up`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from oncelog._client import (
    LAST_ATTEMPT_MIN_S,
    ClusterClient,
    backoff_ms,
    error_from_proto,
    remaining_ms,
)
from oncelog.v1 import coordinator_pb2
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError

log = logging.getLogger("oncelog.coordinators")

T = TypeVar("T")

TRANSACTION = coordinator_pb2.TRANSACTION
GROUP = coordinator_pb2.GROUP

# CONCURRENT_TRANSACTIONS means "the previous transaction's markers are still
# being written" (the coordinator holds such a request for a while before it
# answers this) or "an earlier instance's transaction is being aborted": both
# end within milliseconds, so retry soon; while the first AddPartitionsToTxn of
# a transaction waits, nothing is sent to its partitions. Kafka waits 20 ms;
# we start at 2 ms and double up to 20 ms.
CONCURRENT_TRANSACTIONS_BACKOFF_MS = 2
CONCURRENT_TRANSACTIONS_BACKOFF_MAX_MS = 20


def concurrent_transactions_backoff_ms(attempt: int, *,
                                       rng: random.Random | None = None) -> int:
    """The pause before retry `attempt` (>= 1) after CONCURRENT_TRANSACTIONS."""
    return backoff_ms(attempt, base_ms=CONCURRENT_TRANSACTIONS_BACKOFF_MS,
                      max_ms=CONCURRENT_TRANSACTIONS_BACKOFF_MAX_MS, rng=rng)

# After these the key's coordinator may be another process: look it up again.
COORDINATOR_MOVED = frozenset({
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMED_OUT,
})


class NoCoordinatorError(Exception):
    """The cluster has no coordinator of the kind wanted: retrying cannot help
    (carries the CoordinatorNotAvailableError to raise)."""

    def __init__(self, error: OncelogError) -> None:
        super().__init__(str(error))
        self.error = error


def no_coordinator_error(kind: int, key: str) -> OncelogError:
    what = "transaction coordinator" if kind == TRANSACTION else "group coordinator"
    subject = "transactional id" if kind == TRANSACTION else "group"
    return errors.error_for(
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        f"the cluster has no {what} (Metadata lists none), so {subject} {key!r} has none",
    )


class CoordinatorLocator:
    """The address of one key's coordinator, found with FindCoordinator and
    cached. Safe to share between threads (the address is replaced whole)."""

    def __init__(self, client: ClusterClient, key: str, kind: int) -> None:
        self._client = client
        self.key = key
        self.kind = kind
        self.address: str | None = None
        self._ask_index = random.randrange(1 << 16)

    def _request(self) -> coordinator_pb2.FindCoordinatorRequest:
        return coordinator_pb2.FindCoordinatorRequest(
            key=self.key, type=coordinator_pb2.CoordinatorType.ValueType(self.kind)
        )

    @property
    def service(self) -> str:
        """What the key's coordinator is, for messages."""
        return "transaction coordinator" if self.kind == TRANSACTION else "group coordinator"

    def _ask_address(self, deadline_s: float) -> str:
        """A transaction coordinator to ask FindCoordinator (they all know the
        placement); NoCoordinatorError when the cluster has none of the kind
        wanted. Metadata, when it must be fetched, within deadline_s."""
        md = self._client.metadata(timeout_ms=remaining_ms(deadline_s))
        if not md.coordinators or (self.kind == GROUP and not md.group_coordinators):
            md = self._client.refresh_metadata(timeout_ms=remaining_ms(deadline_s))
        if not md.coordinators:
            if self.kind == GROUP:
                # Transaction coordinators answer FindCoordinator for groups too.
                raise NoCoordinatorError(errors.error_for(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"the cluster has no transaction coordinator (Metadata lists none) to "
                    f"answer FindCoordinator for group {self.key!r}",
                ))
            raise NoCoordinatorError(no_coordinator_error(TRANSACTION, self.key))
        if self.kind == GROUP and not md.group_coordinators:
            raise NoCoordinatorError(no_coordinator_error(GROUP, self.key))
        return md.coordinators[self._ask_index % len(md.coordinators)]

    def lookup(self, timeout_s: float) -> str:
        """One FindCoordinator attempt within timeout_s (metadata included);
        caches and returns the address."""
        deadline_s = time.monotonic() + timeout_s
        address = self._ask_address(deadline_s)
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            raise errors.error_for(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no time left to ask {address} for the {self.service} of {self.key!r}",
            )
        try:
            resp = self._client.coordinator(address).FindCoordinator(
                self._request(), timeout=left_s
            )
        except grpc.RpcError as rpc_exc:
            self._ask_index += 1
            raise self._client.rpc_error(
                rpc_exc, address, service="transaction coordinator"
            ) from rpc_exc
        self._client.note_answered(address)
        return self.accept(resp)

    def accept(self, resp: coordinator_pb2.FindCoordinatorResponse) -> str:
        exc = error_from_proto(resp.error)
        if exc is not None:
            self._ask_index += 1
            raise exc
        if not resp.address:
            self._ask_index += 1
            raise errors.error_for(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"FindCoordinator named no address for {self.key!r}",
            )
        self.address = resp.address
        return resp.address

    def invalidate(self, address: str | None = None) -> None:
        """Forgets the address (only if it is still `address`, when given)."""
        if address is None or self.address == address:
            self.address = None


def call_coordinator_once(
    client: ClusterClient,
    locator: CoordinatorLocator,
    attempt: Callable[[str, float], T],
    timeout_s: float,
) -> T:
    """One attempt(address, timeout_s) at the key's coordinator (found first
    when not cached), for callers that retry on their own schedule (the
    heartbeat thread, poll()); the lookup and the attempt share timeout_s.
    Every failure is raised as an OncelogError, retriable ones included (after
    one that says the coordinator may have moved, the next attempt looks it up
    again), except NoCoordinatorError: the cluster has no coordinator of the
    kind, and retrying cannot help."""
    deadline_s = time.monotonic() + timeout_s
    address = locator.address
    try:
        if address is None:
            address = locator.lookup(timeout_s)
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            raise errors.error_for(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no time left to call the {locator.service} of {locator.key!r} at {address}",
            )
        try:
            result = attempt(address, left_s)
        except grpc.RpcError as rpc_exc:
            raise client.rpc_error(rpc_exc, address, service=locator.service) from rpc_exc
    except OncelogError as exc:
        coordinator_failed(client, locator, address, exc)
        raise
    client.note_answered(address)
    return result


def coordinator_failed(
    client: ClusterClient, locator: CoordinatorLocator, address: str | None, exc: OncelogError
) -> None:
    """After a failed call at `address` (None: the lookup failed): forgets the
    address when the coordinator may have moved, and asks for metadata again
    in the background unless the call merely ran out of time."""
    if exc.code in COORDINATOR_MOVED:
        locator.invalidate(address)
        if exc.code is not ErrorCode.REQUEST_TIMED_OUT:
            client.request_metadata_refresh()


def call_coordinator(
    client: ClusterClient,
    locator: CoordinatorLocator,
    what: str,
    attempt: Callable[[str, float], T],
    *,
    budget_ms: int,
    on_retry: Callable[[OncelogError], None] | None = None,
) -> T:
    """Runs attempt(address, timeout_s) against the key's coordinator until it
    returns, retrying retriable errors (finding the coordinator again when it
    may have moved; CONCURRENT_TRANSACTIONS after a short pause) until
    `budget_ms` has passed, lookups included, then raises KafkaTimeoutError
    naming the last error, or the addresses that did not answer.
    Non-retriable errors are raised as they come, and so is the
    CoordinatorNotAvailableError of a cluster that has no such coordinator.

    attempt raises grpc.RpcError or OncelogError; anything else passes
    through. It must spend no more than the timeout_s it is given.
    """
    started_s = time.monotonic()
    deadline_s = started_s + budget_ms / 1000
    attempts = 0
    concurrent = 0
    exc: OncelogError | None = None
    while True:
        attempts += 1
        timeout_s = min(client.request_timeout_ms / 1000, deadline_s - time.monotonic())
        if timeout_s <= 0:
            raise client.gave_up(what, budget_ms, started_s, exc)
        try:
            return call_coordinator_once(client, locator, attempt, timeout_s)
        except OncelogError as oncelog_exc:
            exc = oncelog_exc
        except NoCoordinatorError as none:
            raise none.error from None
        if not exc.retriable:
            raise exc
        if on_retry is not None:
            on_retry(exc)
        if exc.code is ErrorCode.CONCURRENT_TRANSACTIONS:
            concurrent += 1
            pause_ms = concurrent_transactions_backoff_ms(concurrent)
        else:
            pause_ms = backoff_ms(attempts, base_ms=client.retry_backoff_ms,
                                  max_ms=client.retry_backoff_max_ms)
        left_s = deadline_s - time.monotonic()
        if left_s <= LAST_ATTEMPT_MIN_S:
            raise client.gave_up(what, budget_ms, started_s, exc)
        log.debug("%s: %s; retrying", what, exc)
        time.sleep(min(pause_ms / 1000, left_s - LAST_ATTEMPT_MIN_S))
