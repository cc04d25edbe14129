"""The envelope of every durable value the services write, besides record
batches (which carry their own CRC): snapshots, internal-topic records,
catalog entries.

Every value carries a format version and a CRC32C of its payload, so a reader
can tell a torn or foreign value from a good one and fall back (an older
snapshot, a replay of the log) — docs/contributing.md, "Where a new thing goes".

    byte 0     format version
    bytes 1-4  CRC32C of the payload, big-endian
    bytes 5-   payload

`encode`/`decode` put JSON in the envelope: for small, rare values that are
worth reading in a debugger; the hot path never goes through here.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from oncelog.wire.records import crc32c

_ENVELOPE = struct.Struct(">BI")
ENVELOPE_SIZE_BYTES = _ENVELOPE.size


class CorruptValueError(ValueError):
    """A durable value failed its version or CRC check, or did not parse."""


def seal(version: int, payload: bytes) -> bytes:
    return _ENVELOPE.pack(version, crc32c(payload)) + payload


def unseal(data: bytes, *, version: int, what: str) -> bytes:
    """The payload of a sealed value; raises CorruptValueError naming `what`."""
    if len(data) < ENVELOPE_SIZE_BYTES:
        raise CorruptValueError(
            f"{what}: {len(data)} bytes, shorter than the {ENVELOPE_SIZE_BYTES}-byte envelope"
        )
    found_version, expected_crc = _ENVELOPE.unpack_from(data, 0)
    if found_version != version:
        raise CorruptValueError(f"{what}: version {found_version}, expected {version}")
    payload = data[ENVELOPE_SIZE_BYTES:]
    actual_crc = crc32c(payload)
    if actual_crc != expected_crc:
        raise CorruptValueError(
            f"{what}: CRC32C {actual_crc:#010x}, envelope says {expected_crc:#010x}"
        )
    return payload


def encode(version: int, payload: Any) -> bytes:
    """JSON in the envelope."""
    return seal(version, json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())


def decode(data: bytes, *, expected_version: int, what: str = "durable value") -> Any:
    body = unseal(data, version=expected_version, what=what)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise CorruptValueError(f"{what}: payload is not JSON: {exc}") from exc
