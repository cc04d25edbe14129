"""How the SDK's request streams (oncelog/_request_streams.py) read the way
a stream ended.

Goal: a stream the transport cut under its requests (gRPC's core ends it
with INTERNAL and no Error of ours when the server's process goes away)
fails them with the retriable NETWORK_EXCEPTION, as a lost connection, and
not with UNKNOWN_SERVER_ERROR, which a producer cannot retry; a stream a
store ended with its own Error keeps that Error's code. The services'
stream client reads endings by the same rule
(tests/unit/test_stream_client_endings.py).

Method: RequestStreams over a fake call whose answers end with a given
status, delivered to a list; the translate function is the SDK's own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import status_pb2

from oncelog._client import translate_rpc_error
from oncelog._request_streams import Outcome, RequestStreams
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.status import STATUS_DETAILS_KEY, error_proto


class Ended(grpc.RpcError):
    """A finished call's status, as gRPC's sync stack raises it."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 error: ErrorCode | None = None) -> None:
        self._code = code
        self._details = details
        self._trailing: tuple[tuple[str, bytes], ...] = ()
        if error is not None:
            detail = any_pb2.Any()
            detail.Pack(error_proto(error, details))
            self._trailing = ((STATUS_DETAILS_KEY, status_pb2.Status(
                code=code.value[0], message=details, details=[detail]).SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


class EndingCall:
    """A stream call that takes the first request, then ends with `ending`
    instead of answering it."""

    def __init__(self, requests: Iterator[Any], ending: Ended) -> None:
        self._requests = requests
        self._ending = ending

    def __iter__(self) -> Iterator[Any]:
        next(self._requests)
        raise self._ending

    def cancel(self) -> bool:
        return True


def outcome_of(ending: Ended) -> OncelogError:
    """The error a request's outcome carries when its stream ends with `ending`."""
    delivered: list[Outcome] = []
    done = threading.Event()

    def deliver(_token: Any, outcome: Outcome) -> None:
        delivered.append(outcome)
        done.set()

    # The client's stub: opening the stream gives the call that ends.
    stub = SimpleNamespace(ProduceStream=lambda requests: EndingCall(requests, ending))
    streams = RequestStreams("ProduceStream", lambda _address: stub,
                             lambda exc, _address: translate_rpc_error(exc), deliver)
    streams.send("store:1", ps.ProduceRequest(), token=None, timeout_s=5.0)
    assert done.wait(5.0), "the request's outcome was never delivered"
    (outcome,) = delivered
    with pytest.raises(OncelogError) as failed:
        outcome.result()
    return failed.value


def test_a_stream_cut_by_the_transport_is_a_lost_connection() -> None:
    error = outcome_of(Ended(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert error.code is ErrorCode.NETWORK_EXCEPTION
    assert error.retriable
    assert "store:1" in str(error) and "Internal error from Core" in str(error)


def test_a_store_s_own_error_keeps_its_code() -> None:
    error = outcome_of(Ended(grpc.StatusCode.INTERNAL, "the store failed",
                             ErrorCode.STORAGE_ERROR))
    assert error.code is ErrorCode.STORAGE_ERROR


def test_a_stream_cut_otherwise_is_read_as_before() -> None:
    error = outcome_of(Ended(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert error.code is ErrorCode.NETWORK_EXCEPTION
