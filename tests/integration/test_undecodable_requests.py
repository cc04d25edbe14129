"""Requests whose bytes are not their message, on every RPC of every service.

Goal: a request that does not parse as its method's protobuf message is bad
input like any other (the project rule of test_bad_input_sweep.py): gRPC
status INVALID_ARGUMENT whose details hold our Error with INVALID_REQUEST,
not retriable, its message naming the method and the message type that
failed to parse; it is counted in the method's error metric; and it changes
nothing stored. (grpc alone ends such a call UNKNOWN "Unexpected
DecodeError" with no details.)

Method: the methods come from the service descriptors of every generated
`*_pb2` module in oncelog.v1, and which process serves each service from
that process's server reflection, so an RPC or a service added later is
swept without touching this file (and fails here if no process serves it, or
if it streams one way: services/common/rpc/interceptor.py passes those
through untouched; a request stream gets the bytes as its one message).
Each method gets a few byte strings that are not a valid encoding of any
message (checked with `FromString` first) through a raw channel with
identity serializers. The cluster and its stored state are
test_bad_input_sweep.py's fixture (records, a committed transaction,
committed group offsets), started once for this module; its `observe` reads
the stored state back before and after each method's requests, and a last
test compares it with the setup's. No assertion depends on timing.
"""

from __future__ import annotations

import importlib
import pkgutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client.parser import text_string_to_metric_families

import oncelog.v1
from oncelog.errors import ErrorCode
from oncelog.testing import KINDS
from oncelog.wire.status import error_from_rpc
from tests.integration import test_bad_input_sweep as bad_input
from tests.integration.test_bad_input_sweep import Sweep, observe

# test_bad_input_sweep.py's cluster and stored state, started once more for
# this module (the fixture is module-scoped wherever it is used).
sweep = bad_input.sweep

# Byte strings that no message parses, each broken differently at the wire
# level, so whatever the message's fields, it cannot take them as unknown
# fields and go on.
GARBAGE: dict[str, bytes] = {
    "unterminated varint": b"\xff\xff\xff\xff",
    "length past the end": b"\x0a\x05ab",
    "field number 0": b"\x00",
}


def _oncelog_methods() -> list[MethodDescriptor]:
    """Every method of every service in the generated oncelog.v1 modules."""
    methods: list[MethodDescriptor] = []
    for module_info in pkgutil.iter_modules(oncelog.v1.__path__):
        if not module_info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"{oncelog.v1.__name__}.{module_info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            methods.extend(service.methods)
    return methods


METHODS = _oncelog_methods()


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


@dataclass
class Route:
    """Raw channels to every process and which oncelog service each serves."""

    channels: dict[str, grpc.Channel]
    # Full service name -> the kind of process that serves it.
    served_by: dict[str, str]


@pytest.fixture(scope="module")
def route(sweep: tuple[Sweep, dict[str, object]]) -> Iterator[Route]:
    s, _stored = sweep
    channels = {kind: grpc.insecure_channel(s.cluster.address(kind)) for kind in KINDS}
    try:
        served_by: dict[str, str] = {}
        for kind, channel in channels.items():
            for service in ProtoReflectionDescriptorDatabase(channel).get_services():
                if service.startswith("oncelog."):
                    assert service not in served_by, (service, served_by[service], kind)
                    served_by[service] = kind
        yield Route(channels, served_by)
    finally:
        for channel in channels.values():
            channel.close()


def _counter(s: Sweep, kind: str, name: str, **labels: str) -> float:
    """One sample of a process's counter; 0 when the series does not exist yet."""
    with urllib.request.urlopen(s.cluster.metrics_url(kind), timeout=30) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _refusal(channel: grpc.Channel, method: MethodDescriptor,
             payload: bytes) -> tuple[Any, Any]:
    """The call's RpcError (it must fail) and our Error read from it. A
    request stream (ProduceStream) gets the payload as its one message: an
    undecodable message ends the whole stream."""
    path = _path(method)
    # No serializers: the payload goes out as it is, and a reply would
    # come back as bytes.
    with pytest.raises(grpc.RpcError) as info:
        if method.client_streaming:
            stream = channel.stream_stream(path, request_serializer=None,
                                           response_deserializer=None)
            list(stream(iter([payload]), timeout=30))
        else:
            call = channel.unary_unary(path, request_serializer=None,
                                       response_deserializer=None)
            call(payload, timeout=30)
    return info.value, error_from_rpc(info.value)


@pytest.mark.parametrize("method", METHODS, ids=[m.full_name for m in METHODS])
def test_undecodable_request_is_invalid_and_changes_nothing(
    sweep: tuple[Sweep, dict[str, object]], route: Route, method: MethodDescriptor
) -> None:
    s, _stored = sweep
    path = _path(method)
    type_name = method.input_type.name
    # Request streams (one answer per request) are checked per message; a
    # method streaming one way only is not.
    assert method.client_streaming == method.server_streaming, (
        f"{path} streams one way: teach services/common/rpc/interceptor.py to refuse its "
        "undecodable requests (and to measure it), then sweep it here"
    )
    service = method.containing_service.full_name
    assert service in route.served_by, f"no process serves {service}: {route.served_by}"
    kind = route.served_by[service]
    request_class = message_factory.GetMessageClass(method.input_type)
    for payload in GARBAGE.values():
        with pytest.raises(DecodeError):
            request_class.FromString(payload)
    labels = {"service": method.containing_service.name, "method": method.name}
    requests_before = _counter(s, kind, "oncelog_rpc_requests_total", **labels)
    errors_before = _counter(s, kind, "oncelog_rpc_errors_total", **labels,
                             code=ErrorCode.INVALID_REQUEST.name)
    before = observe(s)

    for what, payload in GARBAGE.items():
        exc, error = _refusal(route.channels[kind], method, payload)
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, exc.code(), exc.details())
        assert ErrorCode.from_wire(error.code) is ErrorCode.INVALID_REQUEST, (what, error)
        assert not error.retriable, (what, error)
        assert error.message.startswith(
            f"request to {path} is not a valid {type_name} ({len(payload)} bytes): "
        ), (what, error.message)
        assert exc.details() == f"INVALID_REQUEST: {error.message}"

    assert observe(s) == before
    # Requests: at least ours, since observe() and the services' own calls
    # to one another (a coordinator reading its log) use some methods too.
    # Nothing else sends an undecodable request, so the errors are exact.
    assert _counter(s, kind, "oncelog_rpc_requests_total", **labels) \
        >= requests_before + len(GARBAGE)
    assert _counter(s, kind, "oncelog_rpc_errors_total", **labels,
                    code=ErrorCode.INVALID_REQUEST.name) == errors_before + len(GARBAGE)


def test_what_the_setup_stored_is_unchanged(sweep: tuple[Sweep, dict[str, object]]) -> None:
    """Runs after every method's requests (pytest keeps a module's order):
    nothing they set off changed the stored state later either."""
    s, stored = sweep
    assert observe(s) == stored
