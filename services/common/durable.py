"""Framing for records the services persist in internal topics and snapshots.

Every durable value carries a format version and a CRC32C of its payload, so a
reader can tell a torn or foreign value from a good one and fall back
(STYLE.md: "Durable bytes"). Payloads are JSON: small, rare, and readable in a
debugger; the hot path (record batches) never goes through here.

    byte 0     format version
    bytes 1-4  CRC32C of the payload, big-endian
    bytes 5-   payload (UTF-8 JSON)
"""

from __future__ import annotations

import json
import struct
from typing import Any

from oncelog.records import crc32c

_FRAME = struct.Struct(">BI")


class CorruptValueError(ValueError):
    """A durable value failed its version or checksum check."""


def encode(version: int, payload: Any) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return _FRAME.pack(version, crc32c(body)) + body


def decode(data: bytes, *, expected_version: int) -> Any:
    if len(data) < _FRAME.size:
        raise CorruptValueError(f"durable value is {len(data)} bytes, shorter than its frame")
    version, crc = _FRAME.unpack_from(data)
    if version != expected_version:
        raise CorruptValueError(f"durable value has version {version}, expected {expected_version}")
    body = data[_FRAME.size :]
    actual = crc32c(body)
    if actual != crc:
        raise CorruptValueError(f"durable value CRC32C is {actual:#010x}, frame says {crc:#010x}")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise CorruptValueError(f"durable value payload is not JSON: {exc}") from exc
