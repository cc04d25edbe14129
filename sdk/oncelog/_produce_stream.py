"""The producer's Produce requests over one ProduceStream per store.

Why: a message on an open gRPC stream costs about half a unary call on this
stack (docs/performance.md), and an acknowledged send is one such hop. The
store handles a stream's requests as it handles concurrent unary calls
(started in arrival order, answered as they complete), so what the sender
knows about ordering, retries and sequence numbers holds unchanged.

Each request gets an id; its answer comes back with it. A request has a
deadline, as a unary call has: one that passes it fails with
REQUEST_TIMED_OUT and ends the stream, as Kafka's client closes a connection
on a request timeout, so that every other request on it fails too (outcome
unknown: the sender retries them with the same sequence numbers, which the
store deduplicates) and the next request opens a fresh stream. A stream that
ends for any other reason (the store stopped, the connection broke) fails
its unanswered requests with the error it ended with. A store that does not
serve ProduceStream (UNIMPLEMENTED: an older version) is sent unary Produce
calls from then on.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from oncelog.v1 import partition_store_pb2
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError

# Ends a stream's request iterator: the client's half-close.
_CLOSE: Any = object()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one request: its answer, or why there is none. Has a
    grpc.Future's result() so that the sender reads both kinds of call alike."""

    answer: partition_store_pb2.ProduceResponse | None = None
    error: OncelogError | None = None

    def result(self) -> partition_store_pb2.ProduceResponse:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


Deliver = Callable[[Any, Outcome], None]


@dataclass(slots=True)
class _Pending:
    token: Any
    deadline_s: float


class _Stream:
    """One ProduceStream to one store: its requests go out through a queue
    that gRPC's own thread drains; a thread of ours reads the answers."""

    def __init__(self, address: str, open_call: Callable[[Iterator[Any]], Any],
                 translate: Callable[[grpc.RpcError], OncelogError], deliver: Deliver) -> None:
        self.address = address
        self._translate = translate
        self._deliver = deliver
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ended: OncelogError | None = None
        self.unimplemented = False
        self._call = open_call(iter(self._outgoing.get, _CLOSE))
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"oncelog-produce-stream {address}")
        self._reader.start()

    def send(self, request: partition_store_pb2.ProduceRequest, token: Any,
             deadline_s: float) -> bool:
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
                                      f"the store at {self.address} ended the stream")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                # Retriable: the sender sends these again, unary this time.
                self.unimplemented = True
                reason = errors.error_for(
                    ErrorCode.NETWORK_EXCEPTION,
                    f"the store at {self.address} does not serve ProduceStream")
            else:
                reason = self._translate(exc)
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


class ProduceStreams:
    """The sender's streams, one per store address, opened on first use and
    again after one ends. `deliver(token, outcome)` runs on a thread of the
    streams' (never the caller's) once per request sent."""

    def __init__(self, stub_of: Callable[[str], Any],
                 translate: Callable[[grpc.RpcError], OncelogError], deliver: Deliver) -> None:
        self._stub_of = stub_of
        self._translate = translate
        self._deliver = deliver
        self._streams: dict[str, _Stream] = {}
        self._unary_only: set[str] = set()
        self._ids = itertools.count(1)

    def serves(self, address: str) -> bool:
        """False once the store at `address` turned out not to serve streams."""
        if address in self._unary_only:
            return False
        stream = self._streams.get(address)
        if stream is not None and stream.unimplemented:
            self._unary_only.add(address)
            del self._streams[address]
            return False
        return True

    def send(self, address: str, request: partition_store_pb2.ProduceRequest, token: Any,
             timeout_s: float) -> None:
        """Sends the request on the address's stream; its outcome reaches
        `deliver` with `token`. Raises what opening a stream raises."""
        request.request_id = next(self._ids)
        deadline_s = time.monotonic() + timeout_s
        stream = self._streams.get(address)
        if stream is None or not stream.send(request, token, deadline_s):
            stream = self._streams[address] = _Stream(
                address, self._stub_of(address).ProduceStream, self._translate, self._deliver)
            if not stream.send(request, token, deadline_s):
                # It ended before it took anything (refused at once).
                self._deliver(token, Outcome(error=stream.ended or errors.error_for(
                    ErrorCode.NETWORK_EXCEPTION, f"the stream to {address} ended")))

    def expire(self) -> float | None:
        """Times out requests past their deadline; returns, in seconds from
        now, when the next deadline falls (None: nothing is waiting)."""
        now_s = time.monotonic()
        next_s: float | None = None
        for stream in list(self._streams.values()):
            deadline_s = stream.expire(now_s)
            if deadline_s is not None:
                next_s = deadline_s if next_s is None else min(next_s, deadline_s)
        return None if next_s is None else max(0.0, next_s - now_s)

    def close(self, reason: OncelogError | None = None) -> None:
        for stream in self._streams.values():
            stream.close(reason)
        self._streams.clear()
