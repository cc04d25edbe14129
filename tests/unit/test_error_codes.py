"""The SDK's ErrorCode mirrors the protos' enum one to one, and every code has
an exception class of the right kind.

Method: compare names and numbers with oncelog.v1.errors_pb2.ErrorCode.
"""

from __future__ import annotations

from oncelog import errors
from oncelog.errors import ErrorCode, Kind
from oncelog.v1 import errors_pb2


def test_parity_with_protos() -> None:
    proto = {v.name: v.number for v in errors_pb2.ErrorCode.DESCRIPTOR.values}
    python = {c.name: int(c) for c in ErrorCode}
    assert python == proto


def test_every_code_has_a_class_of_its_kind() -> None:
    for code in ErrorCode:
        if code is ErrorCode.NONE:
            continue
        exc = errors.error_for(code, "why")
        assert exc.code is code
        assert exc.message == "why"
        if code.kind is Kind.RETRIABLE:
            assert isinstance(exc, errors.RetriableError)
        if code.kind is Kind.FATAL:
            assert isinstance(exc, errors.FatalError)
        if code.kind is Kind.ABORTABLE:
            assert isinstance(exc, errors.TransactionAbortableError)


def test_unknown_wire_number_is_unknown_server_error() -> None:
    assert ErrorCode.from_wire(4242) is ErrorCode.UNKNOWN_SERVER_ERROR
    assert isinstance(errors.error_for(4242), errors.OncelogError)
