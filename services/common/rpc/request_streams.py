"""Request streams: one long-lived RPC carrying many requests, each answered
in the stream under the request_id its client gave it (ProduceStream,
EndTxnStream, AddPartitionsToTxnStream, WriteTxnMarkersStream).

Why: on this stack a unary gRPC call costs about twice what one message on an
open stream costs (docs/performance.md), and the producer's path is a chain
of such hops. A stream keeps the semantics of concurrent unary calls: every
request is started in the order it arrived and answered when it completes.

What runs per message rather than per call: the RPC interceptor's metrics
and shutdown gate, and the security guard's authorization. Neither can
answer a message itself (the answer belongs in the servicer's output), so
the guard hands the servicer a `Refused` in place of a request it refuses,
and the servicer answers it in the stream as it answers a request that
failed as a whole.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from oncelog.wire.errors import ErrorCode

from ..kernel.errors import ServiceError

log = logging.getLogger(__name__)

class _Identified(Protocol):
    """A stream's request: it carries the id its answer goes back under."""

    @property
    def request_id(self) -> int: ...


Request = TypeVar("Request", bound=_Identified)
Answer = TypeVar("Answer")


@dataclass(frozen=True, slots=True)
class Refused:
    """A request of a stream that an interceptor refused before the
    servicer ran: the servicer answers `error` under `request_id`."""

    request_id: int
    error: ServiceError


_END: Any = object()

# How much one stream may have started and not yet answered. Beyond either
# bound the stream's next message is not read until a request completes, so
# gRPC's flow control pushes back on the client (Kafka mutes a connection so).
# Without it, a client that ignores throttling, or streams faster than the
# store writes, makes the server hold every request it sent (a task and its
# bytes each) for as long as they wait. A single request larger than the
# bytes bound still runs, alone.
MAX_STREAM_IN_FLIGHT = 1024
MAX_STREAM_IN_FLIGHT_BYTES = 64 << 20


def _size_bytes(request: object) -> int:
    """A request's encoded size (a protobuf message's ByteSize); 0 for a
    refusal, which holds no payload."""
    size = getattr(request, "ByteSize", None)
    return int(size()) if callable(size) else 0


async def answer_each(
    requests: AsyncIterator[Request | Refused],
    handle: Callable[[Request], Awaitable[Answer]],
    answer_type: Callable[..., Answer],
    *,
    max_in_flight: int = MAX_STREAM_IN_FLIGHT,
    max_in_flight_bytes: int = MAX_STREAM_IN_FLIGHT_BYTES,
) -> AsyncIterator[Answer]:
    """Answers every request of `requests` (messages with a `request_id`):
    `handle(request)` in a task of its own, started in arrival order, or
    `answer_type(request_id=..., error=...)` when the request was refused
    or `handle` raised (ServiceError: its code; anything else:
    UNKNOWN_SERVER_ERROR, logged). Answers come
    out as they complete. Ends once the requests end and every started one
    is answered; an exception of the request iterator (an interceptor ending
    the stream) is raised after the answers of the requests already started.
    At most `max_in_flight` requests, of at most `max_in_flight_bytes`
    together, run at once; the next message waits to be read until one
    completes."""
    answers: asyncio.Queue[Answer] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()
    in_flight_bytes = 0
    room = asyncio.Event()

    def finished(size_bytes: int, _task: asyncio.Task[None]) -> None:
        nonlocal in_flight_bytes
        in_flight_bytes -= size_bytes
        room.set()

    def failed(request_id: int, error: ServiceError) -> Answer:
        return answer_type(request_id=request_id, error=error.to_proto())

    async def one(request: Request | Refused) -> None:
        if isinstance(request, Refused):
            answers.put_nowait(failed(request.request_id, request.error))
            return
        request_id = request.request_id
        try:
            answer = await handle(request)
        except ServiceError as exc:
            answer = failed(request_id, exc)
        except Exception as exc:  # a bug: answer it rather than leave the client waiting
            log.exception("a request of a stream failed")
            answer = failed(request_id, ServiceError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"the request failed: {exc!r}"))
        answers.put_nowait(answer)

    async def read() -> None:
        nonlocal in_flight_bytes
        try:
            async for request in requests:
                size_bytes = _size_bytes(request)
                while running and (len(running) >= max_in_flight
                                   or in_flight_bytes + size_bytes > max_in_flight_bytes):
                    room.clear()
                    await room.wait()
                in_flight_bytes += size_bytes
                task = asyncio.create_task(one(request))
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(functools.partial(finished, size_bytes))
        finally:
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            answers.put_nowait(_END)

    reader = asyncio.create_task(read())
    try:
        while (answer := await answers.get()) is not _END:
            yield answer
        await reader
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
