"""The server interceptor every service runs its oncelog RPCs through.

It does four things that must see every call:

* errors: a ServiceError a servicer raises ends the call with its code in
  the status details (status.abort_with), here and nowhere else, so a
  servicer method is written as if errors were ordinary exceptions; a
  service's own exceptions that mean a code (the partition store's storage
  failures: STORAGE_ERROR) are translated by the `translate_error` it
  gives, so that they never reach a client as UNKNOWN;
* metrics: requests, errors by oncelog error code (read from the status
  details the servicer attached, the same way a client reads them), failed
  items inside successful responses, and latency, labelled by gRPC service
  and method (services/common/kernel/metrics.py);
* the shutdown gate: once draining, new oncelog RPCs are refused with
  SHUTTING_DOWN (retriable), while the ones already running are counted so
  that shutdown can wait for them. Health checking and reflection pass
  through untouched, so probes keep getting answers (NOT_SERVING) while the
  process drains;
* undecodable requests: bytes that do not parse as the method's request
  message are refused with INVALID_REQUEST (gRPC INVALID_ARGUMENT) naming
  the method and the parse error, before any servicer code runs — so they
  change nothing. Left to grpc, the DecodeError of the deserializer ends
  the call UNKNOWN ("Unexpected DecodeError") with no details.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from prometheus_client import Counter

from oncelog.v1 import errors_pb2
from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_status

from ..kernel import metrics
from ..kernel.errors import ServiceError
from .status import abort_with

# Only our own services are measured and gated; health and reflection are not.
_OWN_PREFIX = "/oncelog."
_ERROR_TYPE = errors_pb2.Error.DESCRIPTOR.full_name


@dataclass(frozen=True, slots=True)
class _ErrorFields:
    """Where a response message carries oncelog Errors: its own top-level
    `error` field (a request-level failure sent in the body) and repeated
    fields whose items have an `error` (per partition, topic, group, ...)."""

    top_level: str | None
    per_item: tuple[str, ...]


_error_fields_cache: dict[str, _ErrorFields] = {}


def _is_error_field(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.full_name == _ERROR_TYPE


def _error_fields(descriptor: Any) -> _ErrorFields:
    cached = _error_fields_cache.get(descriptor.full_name)
    if cached is None:
        top = next((f.name for f in descriptor.fields
                    if f.name == "error" and _is_error_field(f)), None)
        items = tuple(
            f.name for f in descriptor.fields
            if f.is_repeated and f.message_type is not None
            and any(g.name == "error" and _is_error_field(g) for g in f.message_type.fields)
        )
        cached = _error_fields_cache[descriptor.full_name] = _ErrorFields(top, items)
    return cached


def response_error_codes(response: Message) -> tuple[int, list[int]]:
    """(the top-level error code or 0, the non-zero codes of failed items)."""
    fields = _error_fields(response.DESCRIPTOR)
    top = getattr(response, fields.top_level).code if fields.top_level else 0
    items = [
        item.error.code
        for name in fields.per_item
        for item in getattr(response, name)
        if item.error.code
    ]
    return top, items


def _code_name(code: int) -> str:
    try:
        return ErrorCode.from_wire(code).name
    except ValueError:
        # A code from a newer peer: still bounded (the wire enum is int32 but
        # our servers only send codes they know).
        return f"CODE_{code}"


@dataclass(slots=True)
class _MethodMetrics:
    """The metric children of one method, looked up once."""

    service: str
    method: str
    requests: Any
    latency: Any
    in_flight: Any
    errors: dict[int, Any] = field(default_factory=dict)
    result_errors: dict[int, Any] = field(default_factory=dict)

    def error(self, code: int) -> None:
        self._inc(self.errors, metrics.RPC_ERRORS, code)

    def answered(self, response: Message) -> None:
        """Counts what a response says failed: the request as a whole, or items."""
        top, items = response_error_codes(response)
        if top:
            self.error(top)
        for code in items:
            self.result_error(code)

    def result_error(self, code: int) -> None:
        self._inc(self.result_errors, metrics.RPC_RESULT_ERRORS, code)

    def _inc(self, children: dict[int, Any], counter: Counter, code: int) -> None:
        child = children.get(code)
        if child is None:
            child = children[code] = counter.labels(self.service, self.method, _code_name(code))
        child.inc()


def _split_method(full_method: str) -> tuple[str, str]:
    """'/oncelog.v1.PartitionStore/Produce' -> ('PartitionStore', 'Produce')."""
    service, _, method = full_method.lstrip("/").partition("/")
    return service.rsplit(".", 1)[-1], method


Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
StreamBehavior = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]
Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """What the wrapped deserializer hands the behavior in place of a request
    whose bytes did not parse. grpc gives a deserializer no way to end the
    call with a status of our choosing (whatever it raises becomes UNKNOWN),
    so the refusal is carried to the behavior, which has the context."""

    message: str


def _request_type_name(full_method: str) -> str:
    """'/oncelog.v1.PartitionStore/Produce' -> 'ProduceRequest', from the
    protos the servicers registered."""
    try:
        method = descriptor_pool.Default().FindMethodByName(
            full_method.lstrip("/").replace("/", "."))
    except KeyError:
        # Only for a handler registered without its generated module (none
        # are): the message still names the method.
        return "request message"
    return str(method.input_type.name)


def _decoding(deserializer: Deserializer, full_method: str) -> Deserializer:
    """`deserializer` with a DecodeError turned into an _Undecodable."""
    type_name = _request_type_name(full_method)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return _Undecodable(
                f"request to {full_method} is not a valid {type_name} "
                f"({len(data)} bytes): {exc}"
            )

    return deserialize


# A service's own exceptions that mean an error code (the partition store's
# storage failures): the ServiceError to answer, or None.
ErrorTranslator = Callable[[Exception], ServiceError | None]


class RpcInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service_name: str, *,
                 translate_error: ErrorTranslator | None = None) -> None:
        # For the SHUTTING_DOWN message: which process refused.
        self._service_name = service_name
        self._translate_error = translate_error
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def wait_idle(self, timeout_s: float) -> bool:
        """Waits until no oncelog RPC is running; False if timeout_s passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        full_method = handler_call_details.method
        cached = self._handlers.get(full_method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        # Streams of one request and one answer per message (request
        # streams) are measured and gated per message; a method streaming
        # only one way would pass through unmeasured and its undecodable
        # requests would end UNKNOWN. None exists, and
        # tests/integration/test_undecodable_requests.py fails when one is added.
        if handler is None or not full_method.startswith(_OWN_PREFIX) or (
                handler.unary_unary is None and handler.stream_stream is None):
            return handler
        service, method = _split_method(full_method)
        m = _MethodMetrics(
            service, method,
            requests=metrics.RPC_REQUESTS.labels(service, method),
            latency=metrics.RPC_LATENCY_SECONDS.labels(service, method),
            in_flight=metrics.RPC_IN_FLIGHT.labels(service),
        )
        deserializer = (None if handler.request_deserializer is None
                        else _decoding(handler.request_deserializer, full_method))
        # grpc.aio registers the servicer's coroutine methods as they are.
        if handler.unary_unary is not None:
            behavior: Behavior = handler.unary_unary  # type: ignore[assignment]
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._wrap(behavior, m), request_deserializer=deserializer,
                response_serializer=handler.response_serializer)
        else:
            stream: StreamBehavior = handler.stream_stream  # type: ignore[assignment]
            wrapped = grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(stream, m), request_deserializer=deserializer,
                response_serializer=handler.response_serializer)
        self._handlers[full_method] = wrapped
        return wrapped

    def _wrap(self, behavior: Behavior, m: _MethodMetrics) -> Behavior:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            m.requests.inc()
            # Before the shutdown gate: SHUTTING_DOWN is retriable, and this
            # request can never succeed.
            if isinstance(request, _Undecodable):
                m.error(ErrorCode.INVALID_REQUEST)
                await abort_with(context, ServiceError(ErrorCode.INVALID_REQUEST,
                                                       request.message))
            if self.draining:
                m.error(ErrorCode.SHUTTING_DOWN)
                await abort_with(context, self._shutting_down())
            with self._running(m):
                started = time.perf_counter()
                try:
                    response = await behavior(request, context)
                except asyncio.CancelledError:
                    # The caller went away or the server is stopping: not an
                    # error of the request.
                    raise
                except ServiceError as exc:
                    # Servicers raise ServiceError; here, once for every
                    # method of every service, it becomes the call's status.
                    m.error(exc.code)
                    await abort_with(context, exc)
                except Exception as exc:
                    translated = self._translated(exc)
                    if translated is not None:
                        m.error(translated.code)
                        await abort_with(context, translated)
                    err = error_from_status(context.code(), context.details(),
                                            context.trailing_metadata())
                    m.error(err.code)
                    raise
                except BaseException:
                    err = error_from_status(context.code(), context.details(),
                                            context.trailing_metadata())
                    m.error(err.code)
                    raise
                finally:
                    m.latency.observe(time.perf_counter() - started)
            m.answered(response)
            return response

        return handle

    def _wrap_stream(self, behavior: StreamBehavior, m: _MethodMetrics) -> StreamBehavior:
        """A request stream (services/common/rpc/request_streams.py), measured
        and gated per message: each request counts as a request of the
        method, in flight until its answer (matched by request_id) leaves.
        An undecodable message, or one that arrives while the process
        drains, ends the stream after the answers of the requests already
        started, with INVALID_REQUEST or SHUTTING_DOWN: the client knows
        that whatever it has not had an answer for was not handled."""

        async def handle(requests: AsyncIterator[Any],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if self.draining:
                m.error(ErrorCode.SHUTTING_DOWN)
                await abort_with(context, self._shutting_down())
            started_s: dict[int, float] = {}
            ended_by: list[ServiceError] = []
            unanswered = 0

            async def admitted() -> AsyncIterator[Any]:
                nonlocal unanswered
                async for request in requests:
                    m.requests.inc()
                    if isinstance(request, _Undecodable):
                        m.error(ErrorCode.INVALID_REQUEST)
                        ended_by.append(ServiceError(ErrorCode.INVALID_REQUEST, request.message))
                        return
                    if self.draining:
                        m.error(ErrorCode.SHUTTING_DOWN)
                        ended_by.append(self._shutting_down())
                        return
                    self._enter(m)
                    unanswered += 1
                    started_s.setdefault(request.request_id, time.perf_counter())
                    yield request

            try:
                async for answer in behavior(admitted(), context):
                    if unanswered:
                        unanswered -= 1
                        self._leave(m)
                    began = started_s.pop(answer.request_id, None)
                    if began is not None:
                        m.latency.observe(time.perf_counter() - began)
                    m.answered(answer)
                    yield answer
            except ServiceError as exc:
                # What ends the whole stream (each request's own failure is
                # answered inside it): the call's status, as for unary calls.
                m.error(exc.code)
                ended_by.insert(0, exc)
            except Exception as exc:
                translated = self._translated(exc)
                if translated is None:
                    raise
                m.error(translated.code)
                ended_by.insert(0, translated)
            finally:
                for _ in range(unanswered):
                    self._leave(m)
            if ended_by:
                await abort_with(context, ended_by[0])

        return handle

    def _translated(self, exc: Exception) -> ServiceError | None:
        return None if self._translate_error is None else self._translate_error(exc)

    def _shutting_down(self) -> ServiceError:
        return ServiceError(ErrorCode.SHUTTING_DOWN,
                            f"{self._service_name} is shutting down; retry after it restarts")

    def _enter(self, m: _MethodMetrics) -> None:
        self._in_flight += 1
        self._idle.clear()
        m.in_flight.inc()

    def _leave(self, m: _MethodMetrics) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
        m.in_flight.dec()

    @contextlib.contextmanager
    def _running(self, m: _MethodMetrics) -> Iterator[None]:
        self._enter(m)
        try:
            yield
        finally:
            self._leave(m)
