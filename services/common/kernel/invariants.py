"""Broken-invariant checks, free of grpc so pure `core/` modules can use them.

Every module imports them from here, whether it is pure or not.
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
