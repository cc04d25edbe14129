"""Value types that core functions return instead of raising: an expected
failure is a `Rejection` (an error code and a message naming what was wrong);
the runtime turns it into a ServiceError at its boundary."""

from __future__ import annotations

from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Rejection:
    """An expected refusal: bad input or a state the request does not fit."""

    code: ErrorCode
    message: str
