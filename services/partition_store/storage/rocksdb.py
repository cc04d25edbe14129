"""The RocksDB adapter (rocksdict, raw bytes keys and values).

* Compression off: batch values are opaque, already compact, and compression
  costs CPU on the produce path for nothing (DESIGN.md §10).
* WAL on, writes with sync off. rocksdict holds the GIL during
  write(sync=True), stalling the event loop; instead one flusher thread calls
  flush_wal(True), which releases it, once per group commit (`sync`).
  Without sync a write is still in the OS page cache once write() returns,
  so it survives kill -9 of the process (not a power loss).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import rocksdict

from .port import WriteGroup


class RocksStore:
    def __init__(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_compression_type(rocksdict.DBCompressionType.none())
        self._db = rocksdict.Rdict(str(path), options)
        write_options = rocksdict.WriteOptions()
        write_options.sync = False
        self._db.set_write_options(write_options)
        self._closed = False

    def write(self, group: WriteGroup) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for op, key, value in group.ops:
            if op == "put":
                batch.put(key, value)
            elif op == "delete":
                batch.delete(key)
            elif op == "delete_range":
                batch.delete_range(key, value)
            else:
                raise ValueError(f"unknown write op {op!r}")
        self._db.write(batch)

    def sync(self) -> None:
        self._db.flush_wal(True)

    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        read_options = rocksdict.ReadOptions()
        read_options.set_iterate_upper_bound(end)
        it = self._db.iter(read_options)
        try:
            it.seek(start)
            while it.valid():
                yield it.key(), it.value()
                it.next()
        finally:
            # Drop the iterator now: a live one pins memtables and keeps the
            # database from closing.
            del it

    def seek_for_prev(self, key: bytes, lower_bound: bytes) -> tuple[bytes, bytes] | None:
        it = self._db.iter()
        try:
            it.seek_for_prev(key)
            # Checked here rather than with iterate_lower_bound, which
            # rocksdict's seek_for_prev does not honor.
            if not it.valid():
                return None
            found = it.key()
            if found < lower_bound:
                return None
            return found, it.value()
        finally:
            del it

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.flush_wal(True)
            self._db.close()
