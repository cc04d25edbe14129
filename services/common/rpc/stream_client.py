"""The services' requests to each other over request streams.

Why: the services' calls to each other sit on every transaction's path (the
coordinators' appends of Ongoing, PrepareCommit and CompleteCommit; a store
verifying a producer's first transactional write with its coordinator; the
coordinator's markers), and a message on an open stream costs about half a
unary call (docs/performance.md). The server handles a stream's requests as
concurrent unary calls (request_streams.py), so callers see the same answers
and the same errors: a request whose stream ends before its answer fails
with the failure the stream ended with; one that waits past its deadline
fails with REQUEST_TIMED_OUT and ends the stream (a stalled connection), so
that the next request opens a fresh one. The SDK's threaded counterpart is
oncelog/_request_streams.py.

`StreamMethod` keeps one stream per server address for one method, and
falls back to the unary method for a server that does not serve the stream
(UNIMPLEMENTED: an older version, during a rolling upgrade), and asks a
request once more by the unary method when its stream was cut before any
answer (gRPC can report that refusal as a cut). Given the
process's `InProcess` (local_calls.py), it answers a request to this
process's own address with the servicer's handler, without gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any, Generic, Protocol, TypeVar

import grpc

from oncelog.v1 import errors_pb2
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import cut_by_transport, error_from_rpc

from ..kernel.errors import ServiceError
from .local_calls import InProcess, local_call


class _Request(Protocol):
    request_id: int

    def SerializeToString(self) -> bytes: ...  # noqa: N802 - protobuf's name


class _Answer(Protocol):
    request_id: int

    @property
    def error(self) -> errors_pb2.Error: ...


Request = TypeVar("Request", bound=_Request)
Answer = TypeVar("Answer", bound=_Answer)


class RequestStream(Generic[Request, Answer]):
    """One open stream of `method` (a full gRPC method name) on `channel`."""

    def __init__(self, channel: grpc.aio.Channel, method: str, answer_type: type[Answer]) -> None:
        self.channel = channel
        # No request iterator: requests go in through write() (grpc.aio's
        # stubs say the iterator is required; it is not).
        self._call: Any = channel.stream_stream(
            method, request_serializer=_serialize,
            response_deserializer=answer_type.FromString,  # type: ignore[attr-defined]
        )()  # type: ignore[call-arg]
        self._answer_type = answer_type
        self._pending: dict[int, asyncio.Future[Answer]] = {}
        self._ids = itertools.count(1)
        # grpc.aio takes one write at a time on a call.
        self._write_lock = asyncio.Lock()
        self.ended = False
        # Whether any answer came back on it, and whether the transport cut
        # it (StreamMethod asks a stream cut before its first answer again
        # by a unary call).
        self.answered = False
        self.cut = False
        # Why the stream ended, once it has.
        self.failure: BaseException = ServiceError(ErrorCode.NETWORK_EXCEPTION,
                                                   "the stream ended; retry")
        self._reader = asyncio.create_task(self._read())

    async def ask(self, request: Request, timeout_s: float) -> Answer:
        """The request's answer (its own `error` may be set); raises
        grpc.RpcError when the stream ended without it,
        ServiceError(REQUEST_TIMED_OUT) after timeout_s."""
        request_id = request.request_id = next(self._ids)
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = answer
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    async with self._write_lock:
                        await self._call.write(request)
                except (grpc.RpcError, asyncio.InvalidStateError):
                    # The stream has ended: a write reports that as INTERNAL
                    # (or InvalidStateError); the reader has the status it
                    # ended with (UNIMPLEMENTED from an older server).
                    await asyncio.wait([self._reader])
                    raise self.failure from None
                return await answer
        except TimeoutError:
            self.close()
            raise ServiceError(ErrorCode.REQUEST_TIMED_OUT,
                               f"no answer within {timeout_s} s") from None
        finally:
            self._pending.pop(request_id, None)
            if answer.done() and not answer.cancelled():
                # The reader failed it when the stream ended; what the caller
                # gets is raised above. Unread, asyncio would log it as an
                # error nobody retrieved each time a server restarts.
                answer.exception()

    def close(self) -> None:
        self.ended = True
        self._call.cancel()

    async def _read(self) -> None:
        failure: BaseException
        try:
            while True:
                answer = await self._call.read()
                if not isinstance(answer, self._answer_type):  # grpc.aio.EOF
                    break
                self.answered = True
                waiting = self._pending.get(answer.request_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
            failure = ServiceError(ErrorCode.NETWORK_EXCEPTION, "the server ended the stream")
        except grpc.RpcError as exc:
            cut = _cut_by_transport(exc)
            self.cut = cut is not None
            failure = cut or exc
        except asyncio.CancelledError:
            failure = ServiceError(ErrorCode.NETWORK_EXCEPTION, "the stream was closed")
        self.ended = True
        self.failure = failure
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(failure)
        with contextlib.suppress(Exception):
            self._call.cancel()


def _cut_by_transport(exc: grpc.RpcError) -> ServiceError | None:
    """NETWORK_EXCEPTION for a stream the transport cut (wire/status.py's
    cut_by_transport says how that shows): a coordinator stopping during a
    rolling restart cut a store's verification stream, and read as the
    server's INTERNAL (UNKNOWN_SERVER_ERROR) the producer whose write was
    being verified could not retry."""
    if cut_by_transport(exc):
        return ServiceError(ErrorCode.NETWORK_EXCEPTION,
                            f"the stream was cut: {exc.details()}; retry")
    return None


def _serialize(request: _Request) -> bytes:
    return request.SerializeToString()


class StreamMethod(Generic[Request, Answer]):
    """Requests of one kind over one stream per server address.

    `stream_method` and `unary_method` are full gRPC method names (the
    stream's and its unary counterpart's). A server that answers the stream
    with UNIMPLEMENTED is asked with unary calls from then on. With `local`,
    a request to an address of this process goes to its handler there."""

    def __init__(self, stream_method: str, unary_method: str, answer_type: type[Answer], *,
                 local: InProcess | None = None) -> None:
        self._local = local
        self._stream_method = stream_method
        self._unary_method = unary_method
        self._answer_type = answer_type
        self._streams: dict[str, RequestStream[Request, Answer]] = {}
        self._unary_only: set[str] = set()

    async def ask(self, address: str, channel: grpc.aio.Channel, request: Request,
                  timeout_s: float) -> Answer:
        """The answer of the server at `address` (reached over `channel`).
        Raises ServiceError with the server's code when the request failed
        as a whole (its status, or the answer's `error`), or with the
        transport's code (NETWORK_EXCEPTION, REQUEST_TIMED_OUT, ...)."""
        here = local_call(self._local, address, self._stream_method)
        if here is not None:
            local_answer: Answer = await here(request, timeout_s)
            return local_answer
        try:
            if address in self._unary_only:
                answer = await self._unary(channel, request, timeout_s)
            else:
                answer = await self._on_stream(address, channel, request, timeout_s)
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
            raise ServiceError(ErrorCode.from_wire(error.code), error.message) from exc
        if answer.error.code != 0:
            raise ServiceError(ErrorCode.from_wire(answer.error.code), answer.error.message)
        return answer

    async def _on_stream(self, address: str, channel: grpc.aio.Channel, request: Request,
                         timeout_s: float) -> Answer:
        """The answer on the address's stream, or by a unary call where the
        stream cannot say: a server that does not serve it, or a stream cut
        before its first answer."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        stream = self._stream(address, channel)
        try:
            return await stream.ask(request, timeout_s)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unary_only.add(address)
        except ServiceError:
            # A write to a stream the server has already ended fails, and
            # grpc.aio then reports INTERNAL "Internal error from Core" in
            # place of the server's own status: an older server's
            # UNIMPLEMENTED reads like a server going away. On a stream that
            # never answered, one unary call tells the two apart: an older
            # server answers it, one going away refuses it too (UNAVAILABLE,
            # as retriable as the cut). The stream is tried again next time.
            if not stream.cut or stream.answered:
                raise
        remaining_s = deadline_s - loop.time()
        if remaining_s <= 0:
            raise ServiceError(ErrorCode.REQUEST_TIMED_OUT, f"no answer within {timeout_s} s")
        return await self._unary(channel, request, remaining_s)

    def _stream(self, address: str, channel: grpc.aio.Channel) -> RequestStream[Request, Answer]:
        """The open stream to `address` (a new one when the last ended, or
        when the channel was replaced after a certificate change)."""
        stream = self._streams.get(address)
        if stream is None or stream.ended or stream.channel is not channel:
            if stream is not None:
                stream.close()
            stream = self._streams[address] = RequestStream(
                channel, self._stream_method, self._answer_type)
        return stream

    async def _unary(self, channel: grpc.aio.Channel, request: Request,
                     timeout_s: float) -> Answer:
        call = channel.unary_unary(
            self._unary_method, request_serializer=_serialize,
            response_deserializer=self._answer_type.FromString,  # type: ignore[attr-defined]
        )
        answer: Answer = await call(request, timeout=timeout_s)
        return answer

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
