"""The port the partition store's runtime needs from storage: atomic write
groups, point reads, ordered range scans, a sync, and a reopen after a
failed write. Small on purpose: the RocksDB adapter and the in-memory one
implement exactly this.

Adapters raise the errors below, translated once from their own (the
runtime maps them to STORAGE_ERROR and decides what to do): DiskFullError
when a write found no space (nothing of it applied), CorruptionError when
stored bytes fail a checksum, StorageError for anything else."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


class StorageError(Exception):
    """A storage operation failed."""


class DiskFullError(StorageError):
    """A write found no space left on the device; nothing of it was applied."""


class CorruptionError(StorageError):
    """Stored bytes fail their checksum; `path` is the damaged file when
    the storage engine named it."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


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

    def locate(self, key: bytes) -> str | None:
        """The file that holds `key`, when the storage can tell (for
        messages about damage)."""

    def room_to_reopen(self) -> bool:
        """Whether reopen() would find the space it needs (after a write
        failed with DiskFullError, once space has been freed)."""

    def reopen(self) -> None:
        """Closes and opens the storage again, with what is durable in it:
        after a failed write (RocksDB refuses every write after one failed,
        until it is opened again). Raises what opening raises."""

    def close(self) -> None: ...
