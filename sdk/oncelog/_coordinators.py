"""Finding a transactional id's or a group's coordinator, and calling it with
retries.

`FindCoordinator(key, type)` is answered by any transaction coordinator (the
placement is a pure function of the cluster layout), so a `CoordinatorLocator`
asks the coordinators Metadata lists, in turn, and caches the address until a
call says the coordinator moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS, a transport error). `call_coordinator` is the
blocking retry loop the producer's transactional calls and the admin share.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from oncelog import errors
from oncelog._client import ClusterClient, backoff_ms, error_from_proto, translate_rpc_error
from oncelog.errors import ErrorCode, OncelogError
from oncelog.v1 import coordinator_pb2

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


def concurrent_transactions_backoff_ms(attempt: int) -> int:
    """The pause before retry `attempt` (>= 1) after CONCURRENT_TRANSACTIONS."""
    return backoff_ms(attempt, base_ms=CONCURRENT_TRANSACTIONS_BACKOFF_MS,
                      max_ms=CONCURRENT_TRANSACTIONS_BACKOFF_MAX_MS)

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

    def _ask_address(self) -> str:
        """A transaction coordinator to ask FindCoordinator (they all know the
        placement); NoCoordinatorError when the cluster has none of the kind
        wanted."""
        md = self._client.metadata()
        if not md.coordinators or (self.kind == GROUP and not md.group_coordinators):
            md = self._client.refresh_metadata(timeout_ms=self._client.request_timeout_ms)
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
        """One FindCoordinator attempt; caches and returns the address."""
        address = self._ask_address()
        try:
            resp = self._client.coordinator(address).FindCoordinator(
                self._request(), timeout=timeout_s
            )
        except grpc.RpcError as rpc_exc:
            self._ask_index += 1
            raise translate_rpc_error(rpc_exc) from None
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
    heartbeat thread, poll()). Every failure is raised as an OncelogError,
    retriable ones included (after one that says the coordinator may have
    moved, the next attempt looks it up again), except NoCoordinatorError: the
    cluster has no coordinator of the kind, and retrying cannot help."""
    address = locator.address
    try:
        if address is None:
            address = locator.lookup(timeout_s)
        return attempt(address, timeout_s)
    except grpc.RpcError as rpc_exc:
        exc = translate_rpc_error(rpc_exc)
    except OncelogError as oncelog_exc:
        exc = oncelog_exc
    if exc.code in COORDINATOR_MOVED:
        locator.invalidate(address)
        if exc.code is not ErrorCode.REQUEST_TIMED_OUT:
            client.request_metadata_refresh()
    raise exc


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
    `budget_ms` has passed, then raises KafkaTimeoutError naming the last error.
    Non-retriable errors are raised as they come, and so is the
    CoordinatorNotAvailableError of a cluster that has no such coordinator.

    attempt raises grpc.RpcError or OncelogError; anything else passes through.
    """
    deadline_s = time.monotonic() + budget_ms / 1000
    attempts = 0
    concurrent = 0
    while True:
        attempts += 1
        remaining_s = deadline_s - time.monotonic()
        timeout_s = max(0.001, min(client.request_timeout_ms / 1000, remaining_s))
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
        if time.monotonic() + pause_ms / 1000 >= deadline_s:
            raise errors.KafkaTimeoutError(
                f"{what} did not succeed within {budget_ms} ms; last error: "
                f"{type(exc).__name__}: {exc.message or exc.code.name}"
            ) from exc
        log.debug("%s: %s; retrying", what, exc)
        time.sleep(pause_ms / 1000)
