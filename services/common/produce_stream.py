"""The services' own Produce requests over one ProduceStream per store.

Why: the coordinators' appends to their internal topics sit on every
transaction's path (the Ongoing, PrepareCommit and CompleteCommit records),
and a message on an open stream costs about half a unary call
(docs/performance.md). The store handles a stream's requests as concurrent
unary calls, so callers see the same answers, and the same errors: a request
whose stream ends before its answer fails with the grpc.RpcError the stream
ended with; one that waits past its deadline fails with REQUEST_TIMED_OUT
and ends the stream (a stalled connection), so that the next request opens
a fresh one. The SDK's threaded counterpart is oncelog/_produce_stream.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import grpc

from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.errors import ErrorCode

from .service_error import ServiceError


class ProduceStream:
    """One open ProduceStream on `channel`."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        stub: ps_grpc.PartitionStoreAsyncStub = ps_grpc.PartitionStoreStub(channel)
        # No request iterator: requests go in through write() (grpc.aio's
        # stubs say the iterator is required; it is not).
        self._call = stub.ProduceStream()  # type: ignore[call-arg]
        self._pending: dict[int, asyncio.Future[ps.ProduceResponse]] = {}
        self._ids = itertools.count(1)
        # grpc.aio takes one write at a time on a call.
        self._write_lock = asyncio.Lock()
        self.ended = False
        self._reader = asyncio.create_task(self._read())

    async def produce(self, request: ps.ProduceRequest, timeout_s: float) -> ps.ProduceResponse:
        """The request's answer; raises grpc.RpcError when the stream ended
        without it, ServiceError(REQUEST_TIMED_OUT) after timeout_s."""
        request_id = request.request_id = next(self._ids)
        answer: asyncio.Future[ps.ProduceResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = answer
        try:
            async with asyncio.timeout(timeout_s):
                async with self._write_lock:
                    await self._call.write(request)
                return await answer
        except TimeoutError:
            self.close()
            raise ServiceError(ErrorCode.REQUEST_TIMED_OUT,
                               f"no answer from the store within {timeout_s} s") from None
        except asyncio.InvalidStateError:
            # Written after the stream ended: ended() failed the others already.
            raise ServiceError(ErrorCode.NETWORK_EXCEPTION,
                               "the stream to the store ended; retry") from None
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        self.ended = True
        self._call.cancel()

    async def _read(self) -> None:
        failure: BaseException
        try:
            while True:
                answer = await self._call.read()
                if not isinstance(answer, ps.ProduceResponse):  # grpc.aio.EOF
                    break
                waiting = self._pending.get(answer.request_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
            failure = ServiceError(ErrorCode.NETWORK_EXCEPTION, "the store ended the stream")
        except grpc.RpcError as exc:
            failure = exc
        except asyncio.CancelledError:
            failure = ServiceError(ErrorCode.NETWORK_EXCEPTION, "the stream was closed")
        self.ended = True
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(failure)
        with contextlib.suppress(Exception):
            self._call.cancel()
