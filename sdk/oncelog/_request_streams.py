"""The producer's requests over request streams: Produce over one
ProduceStream per store, EndTxn over one EndTxnStream per coordinator.

Why: a message on an open gRPC stream costs about half a unary call on this
stack (docs/performance.md), and an acknowledged send is one such hop, a
commit another. The services handle a stream's requests as they handle
concurrent unary calls (started in arrival order, answered as they
complete), so what the sender knows about ordering, retries and sequence
numbers holds unchanged.

Each request gets an id; its answer comes back with it. A request has a
deadline, as a unary call has: one that passes it fails with
REQUEST_TIMED_OUT and ends the stream, as Kafka's client closes a connection
on a request timeout, so that every other request on it fails too (outcome
unknown: the sender retries them with the same sequence numbers, which the
store deduplicates) and the next request opens a fresh stream. A stream that
ends for any other reason (the store stopped, the connection broke) fails
its unanswered requests with the error it ended with; one that the
transport cut (INTERNAL without a server's Error: the store's process went
away under it) with the retriable NETWORK_EXCEPTION. A service that does
not serve the stream (UNIMPLEMENTED: an older version) is sent unary calls
from then on.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc

from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.status import cut_by_transport

# Ends a stream's request iterator: the client's half-close.
_CLOSE: Any = object()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one request: its answer, or why there is none. Has a
    grpc.Future's result() so that the sender reads both kinds of call alike."""

    answer: Any = None
    error: OncelogError | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


Deliver = Callable[[Any, Outcome], None]
# translate(exc, address): the typed error for the status a stream ended with.
Translate = Callable[[grpc.RpcError, str], OncelogError]


@dataclass(slots=True)
class _Pending:
    token: Any
    deadline_s: float


class _Stream:
    """One request stream to one service: its requests go out through a
    queue that gRPC's own thread drains; a thread of ours reads the answers."""

    def __init__(self, address: str, method: str, open_call: Callable[[Iterator[Any]], Any],
                 translate: Translate, deliver: Deliver) -> None:
        self.address = address
        self._method = method
        self._translate = translate
        self._deliver = deliver
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ended: OncelogError | None = None
        self.unimplemented = False
        self._call = open_call(iter(self._outgoing.get, _CLOSE))
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"oncelog-{method} {address}")
        self._reader.start()

    def send(self, request: Any, token: Any, deadline_s: float) -> bool:
        """Queues the request; False when the stream has ended (the caller
        opens another)."""
        with self._lock:
            if self.ended is not None:
                return False
            self._pending[request.request_id] = _Pending(token, deadline_s)
        self._outgoing.put(request)
        return True

    def expire(self, now_s: float) -> float | None:
        """Ends the stream when a request has waited past its deadline (that
        request fails REQUEST_TIMED_OUT, the others as the stream ends);
        returns the earliest deadline still to come."""
        with self._lock:
            if not self._pending:
                return None
            late = [rid for rid, p in self._pending.items() if p.deadline_s <= now_s]
            if not late:
                return min(p.deadline_s for p in self._pending.values())
            timed_out = [self._pending.pop(rid) for rid in late]
        for pending in timed_out:
            self._deliver(pending.token, Outcome(error=errors.error_for(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no answer from {self.address} before the request's deadline")))
        self.close(errors.error_for(
            ErrorCode.NETWORK_EXCEPTION,
            f"the stream to {self.address} was closed after a request to it timed out"))
        return None

    def close(self, reason: OncelogError | None = None) -> None:
        """Ends the stream: at once with `reason` (its unanswered requests
        fail with it), else after the store answers what it was sent."""
        self._outgoing.put(_CLOSE)
        if reason is not None:
            self._end(reason)
            self._call.cancel()

    def _read(self) -> None:
        try:
            for answer in self._call:
                with self._lock:
                    pending = self._pending.pop(answer.request_id, None)
                if pending is not None:  # else answered after it timed out
                    self._deliver(pending.token, Outcome(answer=answer))
            reason = errors.error_for(ErrorCode.NETWORK_EXCEPTION,
                                      f"the service at {self.address} ended the stream")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                # Retriable: the caller sends these again, unary this time.
                self.unimplemented = True
                reason = errors.error_for(
                    ErrorCode.NETWORK_EXCEPTION,
                    f"the service at {self.address} does not serve {self._method}")
            elif cut_by_transport(exc):
                # The store's process went away under the open stream:
                # a lost connection, retried (outcome unknown; the store
                # deduplicates the retries).
                reason = errors.error_for(
                    ErrorCode.NETWORK_EXCEPTION,
                    f"the stream to {self.address} was cut: {exc.details()}")
            else:
                reason = self._translate(exc, self.address)
        except Exception as exc:  # noqa: BLE001 - a broken stream, whatever broke it
            reason = errors.error_for(ErrorCode.NETWORK_EXCEPTION,
                                      f"the stream to {self.address} broke: {exc!r}")
        self._end(reason)

    def _end(self, reason: OncelogError) -> None:
        with self._lock:
            if self.ended is None:
                self.ended = reason
            unanswered = list(self._pending.values())
            self._pending.clear()
        for pending in unanswered:
            self._deliver(pending.token, Outcome(error=reason))


class RequestStreams:
    """Streams of one method (`method`, the name of a stub's stream method,
    e.g. "ProduceStream"), one per address, opened on first use and again
    after one ends. `deliver(token, outcome)` runs on a thread of the
    streams' (never the caller's) once per request sent."""

    def __init__(self, method: str, stub_of: Callable[[str], Any], translate: Translate,
                 deliver: Deliver) -> None:
        self._method = method
        self._stub_of = stub_of
        self._translate = translate
        self._deliver = deliver
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._unary_only: set[str] = set()
        self._ids = itertools.count(1)

    def serves(self, address: str) -> bool:
        """False once the service at `address` turned out not to serve the stream."""
        with self._lock:
            if address in self._unary_only:
                return False
            stream = self._streams.get(address)
            if stream is not None and stream.unimplemented:
                self._unary_only.add(address)
                del self._streams[address]
                return False
            return True

    def send(self, address: str, request: Any, token: Any, timeout_s: float) -> None:
        """Sends the request on the address's stream; its outcome reaches
        `deliver` with `token`. Raises what opening a stream raises."""
        deadline_s = time.monotonic() + timeout_s
        with self._lock:
            request.request_id = next(self._ids)
            stream = self._streams.get(address)
            if stream is not None and stream.send(request, token, deadline_s):
                return
            stream = self._streams[address] = _Stream(
                address, self._method, getattr(self._stub_of(address), self._method),
                self._translate, self._deliver)
        if not stream.send(request, token, deadline_s):
            # It ended before it took anything (refused at once).
            self._deliver(token, Outcome(error=stream.ended or errors.error_for(
                ErrorCode.NETWORK_EXCEPTION, f"the stream to {address} ended")))

    def expire(self) -> float | None:
        """Times out requests past their deadline; returns, in seconds from
        now, when the next deadline falls (None: nothing is waiting)."""
        now_s = time.monotonic()
        next_s: float | None = None
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            deadline_s = stream.expire(now_s)
            if deadline_s is not None:
                next_s = deadline_s if next_s is None else min(next_s, deadline_s)
        return None if next_s is None else max(0.0, next_s - now_s)

    def close(self, reason: OncelogError | None = None) -> None:
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.close(reason)


class StreamCaller:
    """Blocking calls over request streams, for a caller that waits for each
    answer (EndTxn): `call(address, request, timeout_s, unary)` is the
    answer of `request` sent on the address's stream, or of `unary()` (the
    same request as a unary call) at a service that does not serve the
    stream. Failures are raised as a unary call's are: grpc.RpcError from
    `unary`, OncelogError from the stream: `silent(address)` when
    `timeout_s` passes (the stream is ended too)."""

    def __init__(self, method: str, stub_of: Callable[[str], Any],
                 translate: Translate, silent: Callable[[str], OncelogError]) -> None:
        self._streams = RequestStreams(method, stub_of, translate, _resolve)
        self._silent = silent

    def call(self, address: str, request: Any, timeout_s: float,
             unary: Callable[[], Any]) -> Any:
        if self._streams.serves(address):
            answered: Future[Outcome] = Future()
            self._streams.send(address, request, answered, timeout_s)
            wait_s = timeout_s
            late = False
            while True:
                try:
                    outcome = answered.result(wait_s)
                    break
                except TimeoutError:
                    # Fails the request (and ends its stream) once its
                    # deadline, set a moment after ours, has passed.
                    late = True
                    self._streams.expire()
                    wait_s = _EXPIRY_POLL_S
            if late and outcome.error is not None and \
                    outcome.error.code is ErrorCode.REQUEST_TIMED_OUT:
                raise self._silent(address) from outcome.error
            if outcome.error is None or self._streams.serves(address):
                return outcome.result()
        return unary()

    def close(self) -> None:
        self._streams.close()


_EXPIRY_POLL_S = 0.005


def _resolve(token: Any, outcome: Outcome) -> None:
    token.set_result(outcome)
