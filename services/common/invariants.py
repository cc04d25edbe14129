"""Broken-invariant checks, free of grpc so pure `core/` modules can use them.

`services.common.errors` re-exports both names; this module exists because
that one imports grpc, which `core/` packages must not pull in.
"""

from __future__ import annotations

from collections.abc import Callable


class InvariantViolation(RuntimeError):
    """A broken internal invariant: a bug, never an expected outcome."""


def invariant(condition: bool, message: str | Callable[[], str]) -> None:
    """Crashes loudly when a condition we rely on does not hold (unlike assert,
    it survives `python -O`)."""
    if not condition:
        raise InvariantViolation(message() if callable(message) else message)
