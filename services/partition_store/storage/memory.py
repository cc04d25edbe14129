"""An in-memory KeyValueStore (sorted keys) for unit tests and simulation.
`sync` counts calls; `crash_copy()` gives what a restarted process would see
(everything written, since writes here are as durable as the WAL write of the
RocksDB adapter against kill -9)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from .port import WriteGroup


class MemoryStore:
    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._values: dict[bytes, bytes] = {}
        self.sync_count = 0
        self.closed = False

    def write(self, group: WriteGroup) -> None:
        for op, key, value in group.ops:
            if op == "put":
                if key not in self._values:
                    bisect.insort(self._keys, key)
                self._values[key] = value
            elif op == "delete":
                if key in self._values:
                    del self._values[key]
                    self._keys.pop(bisect.bisect_left(self._keys, key))
            elif op == "delete_range":
                lo = bisect.bisect_left(self._keys, key)
                hi = bisect.bisect_left(self._keys, value)
                for k in self._keys[lo:hi]:
                    del self._values[k]
                del self._keys[lo:hi]
            else:
                raise ValueError(f"unknown write op {op!r}")

    def sync(self) -> None:
        self.sync_count += 1

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        lo = bisect.bisect_left(self._keys, start)
        hi = bisect.bisect_left(self._keys, end)
        # A copy of the range: callers may write while they iterate.
        for key in self._keys[lo:hi]:
            yield key, self._values[key]

    def seek_for_prev(self, key: bytes, lower_bound: bytes) -> tuple[bytes, bytes] | None:
        i = bisect.bisect_right(self._keys, key)
        if i == 0:
            return None
        found = self._keys[i - 1]
        if found < lower_bound:
            return None
        return found, self._values[found]

    def locate(self, key: bytes) -> str | None:
        return None

    def room_to_reopen(self) -> bool:
        return True

    def reopen(self) -> None:
        """Nothing to do: every write is applied whole or not at all."""

    def put_raw(self, key: bytes, value: bytes) -> None:
        """Overwrites one value (tests use it to corrupt snapshots)."""
        group = WriteGroup()
        group.put(key, value)
        self.write(group)

    def close(self) -> None:
        self.closed = True
