"""Bounded waits for integration tests: a bug fails the test instead of
hanging it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from oncelog.errors import ErrorCode
from oncelog.wire.status import error_from_rpc

T = TypeVar("T")


def wait_until(what: str, check: Callable[[], bool], deadline_s: float = 60.0) -> None:
    """Polls `check` until it holds; fails the test after deadline_s."""
    give_up_at = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > give_up_at:
            raise AssertionError(f"{what} did not happen within {deadline_s} s")
        time.sleep(0.05)


def retrying(call: Callable[[], T], *, timeout_s: float = 30.0) -> T:
    """A raw gRPC call, retried while it fails with a retriable error of ours
    (a coordinator loading, or away after a restart)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            code = ErrorCode.from_wire(error_from_rpc(exc).code)
            if not code.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
