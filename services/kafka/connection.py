"""One Kafka client connection: frames in, handlers, frames out in order.

Kafka's protocol is request/response over one TCP connection, each frame an
int32 size and the message; a client may send several requests before the
first answer (librdkafka pipelines up to five Produce requests), and the
answers must come back in the order the requests came. Here each request
gets a task as soon as its frame is read, started in arrival order; the
writer sends the answers in that order as they complete. A task runs
without yielding until its first real wait, so Produce requests reach the
store's append (where sequence numbers are checked and offsets assigned) in
the order they came, as the store's own ProduceStream relies on too.

What ends a connection (Kafka's broker does the same): a size prefix below
a header's or above KAFKA_MAX_REQUEST_BYTES, bytes that do not decode as
the request they say they are, an API key or a version we do not serve
(ApiVersions excepted: it answers UNSUPPORTED_VERSION with our versions,
which is how a client learns them), a request other than ApiVersions and
SASL before a SASL connection has authenticated, or a failed Produce with
acks=0 (which takes no answer). Nothing of such a request reaches the
store. Handlers translate expected failures into the response's error
codes; anything else ends the connection and is logged, and the store goes
on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..common.kernel import limits
from . import metrics
from .apis import VERSIONS, ApiKey
from .context import CloseConnection, RequestContext, Session
from .messages import RequestError, decode_request, encode_response, peek_header, request_class

if TYPE_CHECKING:
    from .broker import KafkaBroker

log = logging.getLogger("oncelog.kafka")

_SIZE = struct.Struct(">i")
# api_key, api_version, correlation_id, client_id length: the shortest header.
_MIN_REQUEST_BYTES = 10
# What a connection that has not authenticated yet may send (Kafka's
# SaslServerAuthenticator takes only these before the SASL exchange ends).
_BEFORE_AUTHENTICATION = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                                    ApiKey.SASL_AUTHENTICATE})


class Connection:
    def __init__(self, broker: KafkaBroker, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, session: Session, *, sasl: bool) -> None:
        self._broker = broker
        self._reader = reader
        self._writer = writer
        self.session = session
        # A SASL listener: nothing but the exchange until it authenticates.
        self._sasl = sasl
        # Answers in request order: (correlation id, api, task).
        self._answers: deque[tuple[int, ApiKey, asyncio.Task[Any]]] = deque()
        self._answer_ready = asyncio.Event()
        self._in_flight = asyncio.Semaphore(limits.KAFKA_MAX_IN_FLIGHT_PER_CONNECTION)
        self._closing = False

    @property
    def peer(self) -> str:
        return f"{self.session.host}:{self.session.port}"

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_answers())
        try:
            await self._read_requests()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            log.debug("the Kafka connection of %s ended: %r", self.peer, exc)
        except CloseConnection as exc:
            log.info("closing the Kafka connection of %s: %s", self.peer, exc)
        finally:
            self._closing = True
            self._answer_ready.set()
            # Answers already being worked on are sent unless the writer stops.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer_task, timeout=limits.SHUTDOWN_GRACE_MS / 1000)
            writer_task.cancel()
            for _, _, task in self._answers:
                task.cancel()
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    async def _read_requests(self) -> None:
        reader = self._reader
        while True:
            (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
            if not _MIN_REQUEST_BYTES <= size <= limits.KAFKA_MAX_REQUEST_BYTES:
                metrics.REQUEST_ERRORS.labels("unknown", "frame_size").inc()
                raise CloseConnection(
                    f"a request of {size} bytes (the size prefix): a request is "
                    f"{_MIN_REQUEST_BYTES}..{limits.KAFKA_MAX_REQUEST_BYTES} bytes")
            frame = await reader.readexactly(size)
            await self._in_flight.acquire()
            try:
                self._dispatch(frame)
            except BaseException:
                self._in_flight.release()
                raise

    def _dispatch(self, frame: bytes) -> None:
        """Decodes one request and starts its handler (without waiting)."""
        try:
            key, version, correlation_id = peek_header(frame)
        except RequestError as exc:
            raise CloseConnection(str(exc)) from None
        try:
            api = ApiKey(key)
        except ValueError:
            metrics.REQUEST_ERRORS.labels("unknown", "api_key").inc()
            raise CloseConnection(f"api key {key} is not one this listener serves") from None
        handler = self._broker.handlers.get(api)
        served = VERSIONS[api]
        if handler is None or version not in served:
            if api is ApiKey.API_VERSIONS:
                self._enqueue(correlation_id, api, self._unsupported_api_versions())
                return
            metrics.REQUEST_ERRORS.labels(api.title, "version").inc()
            raise CloseConnection(
                f"{api.title} version {version} is not served (versions "
                f"{served.min_version}..{served.max_version}; ApiVersions lists them)")
        if self._sasl and self.session.principal is None and api not in _BEFORE_AUTHENTICATION:
            metrics.REQUEST_ERRORS.labels(api.title, "unauthenticated").inc()
            raise CloseConnection(f"{api.title} before SASL authentication")
        expiry_ms = self.session.session_expiry_ms
        if (expiry_ms is not None and api not in _BEFORE_AUTHENTICATION
                and time.time() * 1000 > expiry_ms):
            raise CloseConnection("the session's token expired; the client must authenticate "
                                  "again (KIP-368)")
        cls = request_class(key, version)
        if cls is None:
            raise CloseConnection(f"{api.title} version {version} has no schema")
        try:
            header, body = decode_request(frame, cls)
        except RequestError as exc:
            metrics.REQUEST_ERRORS.labels(api.title, "decode").inc()
            raise CloseConnection(str(exc)) from None
        context = RequestContext(header, self.session, self._broker)
        self._enqueue(correlation_id, api, self._handle(handler, context, body))

    async def _handle(self, handler: Any, context: RequestContext, body: Any) -> Any:
        started = time.perf_counter()
        try:
            return await handler(context, body)
        finally:
            metrics.REQUEST_SECONDS.labels(context.api.title).observe(
                time.perf_counter() - started)

    async def _unsupported_api_versions(self) -> Any:
        from .handlers.api_versions import unsupported_version_response

        return unsupported_version_response()

    def _enqueue(self, correlation_id: int, api: ApiKey, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._answers.append((correlation_id, api, task))
        self._answer_ready.set()

    async def _write_answers(self) -> None:
        writer = self._writer
        while True:
            while not self._answers:
                if self._closing:
                    return
                self._answer_ready.clear()
                await self._answer_ready.wait()
            correlation_id, api, task = self._answers[0]
            try:
                body = await task
            except CloseConnection as exc:
                log.info("closing the Kafka connection of %s after %s: %s", self.peer,
                         api.title, exc)
                self._abort()
                return
            except Exception:
                metrics.REQUEST_ERRORS.labels(api.title, "internal").inc()
                log.exception("the Kafka %s request of %s failed; closing its connection",
                              api.title, self.peer)
                self._abort()
                return
            finally:
                self._answers.popleft()
                self._in_flight.release()
            if body is None:
                continue
            try:
                frame = encode_response(correlation_id, body)
            except Exception:
                metrics.REQUEST_ERRORS.labels(api.title, "internal").inc()
                log.exception("the answer to the Kafka %s request of %s cannot be encoded; "
                              "closing its connection", api.title, self.peer)
                self._abort()
                return
            writer.write(frame)
            if self.session.failed_authentication is not None:
                log.info("closing the Kafka connection of %s: %s", self.peer,
                         self.session.failed_authentication)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                self._abort()
                return
            if writer.transport.get_write_buffer_size() > limits.DEFAULT_FETCH_MAX_BYTES:
                await writer.drain()

    def _abort(self) -> None:
        self._closing = True
        self._writer.transport.abort()
