"""The producer's error classes (KIP-1050): one table, consistent and documented.

Goal: every error code a producer can meet has exactly one class — retriable,
abortable, application-recoverable or fatal — in
`oncelog.errors.PRODUCER_ERROR_CLASSES`; the class agrees with the code's wire
kind and with the exception class users catch; the table in docs/sdk.md is
this table, so the documentation cannot drift from what the producer does.
What the producer *does* for each row is driven through a real cluster in
tests/integration/test_producer_error_rows.py.

Method: walk the ErrorCode enum and the table; parse the Markdown table under
"What is fatal, abortable, retried" in docs/sdk.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oncelog import errors
from oncelog._transactions import ends_producer, record_failure
from oncelog.errors import ErrorCode, Kind, ProducerErrorClass

DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def test_every_code_but_none_has_one_class() -> None:
    assert set(errors.PRODUCER_ERROR_CLASSES) == set(ErrorCode) - {ErrorCode.NONE}


@pytest.mark.parametrize("code", [c for c in ErrorCode if c is not ErrorCode.NONE],
                         ids=lambda c: c.name)
def test_the_class_agrees_with_the_wire_kind_and_the_exception(code: ErrorCode) -> None:
    cls = errors.PRODUCER_ERROR_CLASSES[code]
    exc = errors.error_for(code, "x")
    assert errors.producer_error_class(exc) is cls
    if code.kind is Kind.RETRIABLE:
        assert cls is ProducerErrorClass.RETRIABLE
        assert isinstance(exc, errors.RetriableError)
    elif code.kind is Kind.FATAL:
        assert cls in (ProducerErrorClass.APPLICATION_RECOVERABLE, ProducerErrorClass.FATAL)
        assert isinstance(exc, errors.FatalError)
    elif code.kind is Kind.ABORTABLE:
        assert cls is ProducerErrorClass.ABORTABLE
        assert isinstance(exc, errors.TransactionAbortableError)
    else:
        assert cls in (ProducerErrorClass.ABORTABLE, ProducerErrorClass.FATAL)
    assert isinstance(exc, errors.FatalError) == (
        cls in (ProducerErrorClass.APPLICATION_RECOVERABLE, ProducerErrorClass.FATAL))
    assert isinstance(exc, errors.ApplicationRecoverableError) == (
        cls is ProducerErrorClass.APPLICATION_RECOVERABLE)
    assert ends_producer(exc) == (cls in (ProducerErrorClass.APPLICATION_RECOVERABLE,
                                          ProducerErrorClass.FATAL))


def test_client_side_errors_are_sorted_too() -> None:
    # A record that ran out of delivery_timeout_ms: its code is retriable, so
    # it was retried; failing for good it breaks only the transaction.
    timeout = errors.KafkaTimeoutError("expired")
    assert errors.producer_error_class(timeout) is ProducerErrorClass.RETRIABLE
    assert not ends_producer(timeout)
    # A bad argument or a serializer's own exception fails its record only.
    for exc in (TypeError("value must be bytes"), ValueError("bad"), RuntimeError("x")):
        assert errors.producer_error_class(exc) is ProducerErrorClass.ABORTABLE
        assert not ends_producer(exc)
    aborted = errors.TransactionAbortedError("dropped")
    assert errors.producer_error_class(aborted) is ProducerErrorClass.ABORTABLE


def test_a_record_failure_names_the_record_and_keeps_the_class() -> None:
    too_large = errors.error_for(ErrorCode.MESSAGE_TOO_LARGE, "2000 bytes")
    described = record_failure("ledger", 2, too_large)
    assert isinstance(described, errors.MessageTooLargeError)
    assert str(described) == "record for ledger-2: 2000 bytes"
    assert described.__cause__ is too_large
    unplaced = record_failure("ledger", -1, TypeError("value must be bytes"))
    assert isinstance(unplaced, errors.TransactionAbortableError)
    assert "record for ledger: TypeError: value must be bytes" in str(unplaced)


def _documented_table() -> dict[ErrorCode, ProducerErrorClass]:
    text = DOC.read_text()
    section = text.split("### What is fatal, abortable, retried", 1)[1]
    rows: dict[ErrorCode, ProducerErrorClass] = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| (\w+) \| (.*) \|", line.strip())
        if match is None:
            if rows:
                break  # the table ended
            continue
        if match.group(1) == "class":
            continue
        cls = ProducerErrorClass(match.group(1))
        for name in re.findall(r"`(\w+)`", match.group(2)):
            assert ErrorCode[name] not in rows, f"{name} is listed twice in docs/sdk.md"
            rows[ErrorCode[name]] = cls
    return rows


def test_the_documented_table_is_the_table() -> None:
    assert _documented_table() == errors.PRODUCER_ERROR_CLASSES
