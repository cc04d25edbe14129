"""Calls between services that share a process, made without gRPC.

Why: a partition store may also run a transaction coordinator
(`--transaction-coordinator`, docs/coordinator.md, "The coordinator in a
store"). Their calls to each other — the coordinator's appends to
`__transaction_state` and its markers, the store's verification of a
transaction's first write — then stay in one event loop instead of each
costing a loopback round trip through both processes' gRPC stacks.

`InProcess` is what one process answers itself: the addresses it is known
by and, per full gRPC method name, the servicer's handler (the same function
its request streams run for every message). A caller that holds one asks it
first (`local_call`); for any other address, or a method this process does not
serve, it goes over gRPC as before. A method name our protos do not define
is refused on both sides (ValueError): misspelt, it would not fail, only
go over gRPC.

A call keeps a remote call's semantics where callers can tell the
difference: the handler runs in a task of its own, in a fresh context (the
caller's principal is not the callee's: a store's produce handler must not
lend its client's identity to the coordinator it asks), so a caller that
stops waiting — its deadline passed, it was cancelled — leaves the request
running, as a server does with a request whose client went away. A deadline
that passes fails with REQUEST_TIMED_OUT; a handler's ServiceError is the
call's error; anything else is UNKNOWN_SERVER_ERROR, logged, as a request
stream answers it (request_streams.py).

Nothing is authorized on this path: both ends are one process, which over
gRPC authenticates to itself as the cluster's own principal.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from google.protobuf import descriptor_pool

from oncelog.wire.errors import ErrorCode

from ..kernel.errors import ServiceError

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]
# A request this process answers itself: call(request, timeout_s).
LocalCall = Callable[[Any, float], Awaitable[Any]]


class InProcess:
    """The services this process answers itself, and at which addresses."""

    def __init__(self, addresses: Iterable[str]) -> None:
        self.addresses = frozenset(a for a in addresses if a)
        self._handlers: dict[str, Handler] = {}
        self._running: set[asyncio.Task[Any]] = set()

    def serve(self, method: str, handler: Handler) -> None:
        """Answers `method` (a full gRPC method name, such as
        "/oncelog.v1.PartitionStore/ProduceStream") with `handler(request)`."""
        self._handlers[_checked(method)] = handler

    def handler(self, address: str, method: str) -> Handler | None:
        """The handler of `method` when `address` is this process's own."""
        method = _checked(method)
        if address not in self.addresses:
            return None
        return self._handlers.get(method)

    async def call(self, handler: Handler, request: Any, timeout_s: float) -> Any:
        """handler(request)'s answer; see the module docstring for errors."""
        task = asyncio.create_task(_answer(handler, request), context=contextvars.Context())
        self._running.add(task)
        task.add_done_callback(self._finished)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(task)
        except TimeoutError:
            raise ServiceError(ErrorCode.REQUEST_TIMED_OUT,
                               f"no answer within {timeout_s} s") from None


    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            # A request whose caller stopped waiting fails unread: retrieved
            # here, or asyncio logs "Task exception was never retrieved" for
            # each (a store that loses leadership under load fails thousands).
            task.exception()


def local_call(local: InProcess | None, address: str, method: str) -> LocalCall | None:
    """`method` at `address` as a call this process answers itself, or None
    when the request goes over gRPC: the caller has no InProcess, the
    address is another process's, or this process does not serve the
    method. Every client that may call its own process asks here first."""
    if local is None:
        return None
    handler = local.handler(address, method)
    if handler is None:
        return None
    return functools.partial(local.call, handler)


@functools.cache
def _checked(method: str) -> str:
    """`method` when our protos define it. Why: the name is spelled by the
    servicer that serves it and by each client that asks for it, and a
    misspelt one would not fail: the client would quietly go over gRPC."""
    service, _, name = method.removeprefix("/").partition("/")
    try:
        found = descriptor_pool.Default().FindServiceByName(service).methods_by_name.get(name)
    except KeyError:
        found = None
    if found is None:
        raise ValueError(f"{method!r} is no gRPC method of our protos")
    return method


async def _answer(handler: Handler, request: Any) -> Any:
    try:
        return await handler(request)
    except ServiceError:
        raise
    except Exception as exc:  # a bug: the caller gets a code, the log the trace
        log.exception("an in-process request failed")
        raise ServiceError(ErrorCode.UNKNOWN_SERVER_ERROR,
                           f"the request failed: {exc!r}") from exc
