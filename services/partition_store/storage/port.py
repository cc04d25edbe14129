"""The port the partition store's runtime needs from storage: atomic write
groups, point reads, ordered range scans, and a sync. Small on purpose: the
RocksDB adapter and the in-memory one implement exactly this."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class WriteGroup:
    """Puts, deletes and range deletes applied atomically, in order."""

    ops: list[tuple[str, bytes, bytes]] = field(default_factory=list)

    def put(self, key: bytes, value: bytes) -> None:
        self.ops.append(("put", key, value))

    def delete(self, key: bytes) -> None:
        self.ops.append(("delete", key, b""))

    def delete_range(self, start: bytes, end: bytes) -> None:
        """Deletes every key in [start, end)."""
        self.ops.append(("delete_range", start, end))

    def extend(self, other: WriteGroup) -> None:
        self.ops.extend(other.ops)

    def __len__(self) -> int:
        return len(self.ops)


class KeyValueStore(Protocol):
    def write(self, group: WriteGroup) -> None:
        """Applies the group atomically. Not synced: call sync() for that."""

    def sync(self) -> None:
        """Makes every write so far durable (fsync of the write-ahead log).
        Called from one flusher thread, never on the event loop."""

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) for every key in [start, end), ascending."""

    def seek_for_prev(self, key: bytes, lower_bound: bytes) -> tuple[bytes, bytes] | None:
        """The greatest (key, value) with lower_bound <= k <= key, if any."""

    def close(self) -> None: ...
