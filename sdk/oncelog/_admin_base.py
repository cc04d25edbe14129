"""What every Admin call shares: the connection, one time budget per public
call, and the calls to stores and coordinators (oncelog.admin.Admin is
made of this and one class per job)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, Self, TypeVar

import grpc

from oncelog._client import (
    SERVICE,
    ClusterClient,
    ClusterMetadata,
    TopicInfo,
    error_from_proto,
    raise_for_error,
    remaining_ms,
)
from oncelog._security import PLAINTEXT, TokenProvider
from oncelog.config_def import ADMIN, validate
from oncelog.v1 import (
    errors_pb2,
    partition_store_pb2,
    partition_store_pb2_grpc,
    records_pb2,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError

# Kafka's transaction.max.timeout.ms default, and our coordinator's: no
# transaction may stay open longer, so one open longer is hanging.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000
# The states in which a coordinator still owns a transaction's outcome
# (Prepared: a two-phase-commit transaction waiting for its completion).
OPEN_TRANSACTION_STATES = ("Ongoing", "Prepared", "PrepareCommit", "PrepareAbort",
                           "PrepareEpochFence")
# ListOffsets timestamps with a meaning.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
RESET_TARGETS = ("earliest", "latest")

T = TypeVar("T")
P = ParamSpec("P")
# A class of Admin's calls (TopicsAdmin, ...): what _within_budget wraps.
S = TypeVar("S", bound="AdminBase")



def _within_budget(
    method: Callable[Concatenate[S, P], T]
) -> Callable[Concatenate[S, P], T]:
    """A public Admin call: everything it does shares one budget of
    default_api_timeout_ms (see Admin._within)."""

    @functools.wraps(method)
    def bounded(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._within(name=f"{method.__name__}()"):
            return method(self, *args, **kwargs)

    return bounded


def _ms(timeout_s: float) -> int:
    """An attempt's timeout_s as the timeout_ms of a client call (at least 1)."""
    return max(int(timeout_s * 1000), 1)


class AdminBase:
    """The connection and the plumbing of Admin's calls."""

    def __init__(
        self,
        *,
        bootstrap: str,
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        security_protocol: str = PLAINTEXT,
        ssl_cafile: str | os.PathLike[str] | None = None,
        ssl_certfile: str | os.PathLike[str] | None = None,
        ssl_keyfile: str | os.PathLike[str] | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauth_token_provider: TokenProvider | None = None,
    ) -> None:
        """`security_protocol`, `ssl_*` and `sasl_*` (kafka-python's names):
        how to connect to a secured cluster (oncelog._security)."""
        # Every option checked against the table (oncelog.config_def).
        options = validate(ADMIN, {
            "bootstrap": bootstrap, "request_timeout_ms": request_timeout_ms,
            "default_api_timeout_ms": default_api_timeout_ms,
            "retry_backoff_ms": retry_backoff_ms, "retry_backoff_max_ms": retry_backoff_max_ms,
            "security_protocol": security_protocol, "ssl_cafile": ssl_cafile,
            "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile,
            "sasl_mechanism": sasl_mechanism,
            "sasl_oauth_token_provider": sasl_oauth_token_provider,
        })
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            security=options.security,
        )
        self._default_api_timeout_ms = default_api_timeout_ms
        # Per thread: when the public call running in it must have ended.
        self._budget = threading.local()

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
            deadline_s = time.monotonic() + timeout_s
            by_address: dict[str, list[int]] = {}
            for p in sorted(pending):
                address = self._client.leader(topic, p, timeout_ms=remaining_ms(deadline_s))
                by_address.setdefault(address, []).append(p)
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
                resp = self._rpc(address, self._client.store(address).ListOffsets, request,
                                 deadline_s)
                for result in resp.results:
                    exc = error_from_proto(result.error)
                    if exc is None:
                        found[result.partition] = result.offset
                        pending.discard(result.partition)
                    elif exc.retriable:
                        retry = exc
                    elif exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        retry = _not_there_yet(address, topic, result.partition, exc)
                    else:
                        raise exc
            if pending:
                raise retry or errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"ListOffsets answered nothing for {topic} partitions {sorted(pending)}",
                )
            return found

        return self._call("ListOffsets", attempt)

    def _user_topics(self) -> dict[str, int]:
        """User topics (not the internal __ ones) and their partition counts."""
        request = partition_store_pb2.ListTopicsRequest(include_internal=False)
        resp = self._catalog_call("ListTopics", lambda stub: stub.ListTopics, request)
        return {t.name: len(t.partitions) for t in resp.topics if not t.internal}

    # ------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _within(self, timeout_ms: int | None = None, *, name: str | None = None
                ) -> Iterator[None]:
        """Everything done inside shares one budget (default:
        default_api_timeout_ms): each request gets what is left of it. Inside
        another _within, the outer budget holds. With a name (the public
        call's), a KafkaTimeoutError for want of an answer is raised naming
        the call and its whole budget, rather than the request that ran out
        and what was left of the budget when it began. (The CLI bounds a
        whole command with one _within.)"""
        if getattr(self._budget, "deadline_s", None) is not None:
            yield
            return
        budget_ms = self._default_api_timeout_ms if timeout_ms is None else timeout_ms
        started_s = time.monotonic()
        self._budget.deadline_s = started_s + budget_ms / 1000
        try:
            yield
        except errors.KafkaTimeoutError as exc:
            if name is None:
                raise
            restated = self._client.gave_up(name, budget_ms, started_s, exc)
            if restated is exc:
                raise
            raise restated from exc
        finally:
            self._budget.deadline_s = None

    def _left_ms(self) -> int:
        """What is left of the running call's budget (see _within)."""
        deadline_s: float | None = getattr(self._budget, "deadline_s", None)
        if deadline_s is None:
            return self._default_api_timeout_ms
        return remaining_ms(deadline_s)

    def _controller(
        self, timeout_s: float
    ) -> tuple[str, partition_store_pb2_grpc.PartitionStoreStub]:
        """The store that keeps the topic catalog (any store forwards to it,
        but asking it directly saves a hop), and its address; metadata, when
        it must be fetched first, within timeout_s."""
        md = self._client.cached_metadata
        if md is None:
            md = self._client.metadata(timeout_ms=_ms(timeout_s))
        address = md.stores.get(md.controller_node_id, self._client.bootstrap[0])
        return address, self._client.store(address)

    def _rpc(self, address: str, method: Callable[..., T], request: Any, deadline_s: float,
             *, service: str = SERVICE) -> T:
        """method(request) (a stub method of `address`'s) with what is left
        until deadline_s; a call that reached no service raises an error
        naming the address (ClusterClient.rpc_error)."""
        try:
            answer = method(request, timeout=max(deadline_s - time.monotonic(), 0.001))
        except grpc.RpcError as rpc_exc:
            raise self._client.rpc_error(rpc_exc, address, service=service) from rpc_exc
        self._client.note_answered(address)
        return answer

    def _catalog_call(
        self, what: str,
        method: Callable[[partition_store_pb2_grpc.PartitionStoreStub], Callable[..., T]],
        request: Any,
    ) -> T:
        """A catalog request (method(stub): CreateTopics, ...) at the
        controller, with retries."""

        def attempt(timeout_s: float) -> T:
            deadline_s = time.monotonic() + timeout_s
            address, stub = self._controller(timeout_s)
            return self._rpc(address, method(stub), request, deadline_s)

        return self._call(what, attempt)

    def _metadata(self) -> ClusterMetadata:
        return self._call(
            "Metadata", lambda timeout_s: self._client.metadata(timeout_ms=_ms(timeout_s))
        )

    def _topic(self, name: str) -> TopicInfo:
        return self._call(
            "Metadata", lambda timeout_s: self._client.topic(name, timeout_ms=_ms(timeout_s))
        )

    def _refreshed_metadata(self) -> ClusterMetadata:
        return self._call(
            "Metadata",
            lambda timeout_s: self._client.refresh_metadata(timeout_ms=_ms(timeout_s)),
        )

    def _ask_each(self, addresses: Iterable[str], what: str,
                  attempt: Callable[[str, float], T]) -> list[T]:
        """attempt(address, timeout_s) at each address in turn, each with
        retries; the answers in the same order."""
        return [
            self._call(f"{what} at {address}", functools.partial(attempt, address))
            for address in addresses
        ]

    def _call(self, what: str, attempt: Callable[[float], T]) -> T:
        return self._client.call(what, attempt, timeout_ms=self._left_ms())

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()



class _PerKeyAnswer(Protocol):
    """One item of a multi-key answer (a transaction's, a group's)."""

    @property
    def error(self) -> errors_pb2.Error: ...


A = TypeVar("A", bound=_PerKeyAnswer)


def _answer_for(items: Iterable[A], key_of: Callable[[A], str], key: str, what: str) -> A:
    """The item answering for `key`; raises its error, or UNKNOWN_SERVER_ERROR
    when the answer left the key out."""
    for item in items:
        if key_of(item) == key:
            raise_for_error(item.error)
            return item
    raise errors.error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"{what} answered nothing for {key!r}")


def _not_there_yet(address: str, topic: str, partition: int, exc: OncelogError) -> OncelogError:
    """A store that Metadata names as the partition's owner does not know the
    partition (yet): a topic just created reaches each store's catalog a moment
    after the controller's. Retried (with a metadata refresh); a topic that is
    really gone fails the next attempt's Metadata lookup instead."""
    return errors.error_for(
        ErrorCode.LEADER_NOT_AVAILABLE,
        f"store {address} does not know {topic}-{partition} yet: {exc.message or exc.code.name}",
    )
