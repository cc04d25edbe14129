"""The RocksDB adapter (rocksdict, raw bytes keys and values).

* Compression off: batch values are opaque, already compact, and compression
  costs CPU on the produce path for nothing (DESIGN.md §10).
* WAL on, writes with sync off. rocksdict holds the GIL during
  write(sync=True), stalling the event loop; instead one flusher thread calls
  flush_wal(True), which releases it, once per group commit (`sync`).
  Without sync a write is still in the OS page cache once write() returns,
  so it survives kill -9 of the process (not a power loss).

Damaged files are found, never read past (docs/partition-store.md,
"Damaged and full disks"):
* Paranoid checks on (RocksDB's default, set so that it stays): opening
  fails on a table file whose size is not what the MANIFEST says (a
  truncated .sst) and on damaged metadata.
* WAL recovery mode "tolerate corrupted tail records": a record that fails
  its checksum in the middle of a write-ahead log fails the open, where
  the default ("point in time") would stop the replay there and silently
  drop every later write; an incomplete *last* record (a write torn by a
  power loss) is still dropped, as it must be.
* Reads verify block checksums (RocksDB's default), and a scan checks the
  iterator's status when it ends: an iterator that meets a damaged block
  stops as if the range had ended, which would hide the rest of a log.

rocksdict raises bare Exceptions carrying RocksDB's status text; they are
translated here, once, into the port's DiskFullError, CorruptionError
(naming the file) and StorageError.

After a failed write RocksDB refuses every later write until the database
is opened again (it has no Resume() in rocksdict): `reopen`, which the
runtime calls once `room_to_reopen` says the space is there (opening
replays the write-ahead log into a table file, so it needs about the log's
size free).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import rocksdict

from .port import CorruptionError, DiskFullError, StorageError, WriteGroup

log = logging.getLogger("oncelog.partition_store.storage")

# Free space a reopen needs beyond the size of the write-ahead logs it
# replays (the MANIFEST, OPTIONS and info log it writes).
REOPEN_MARGIN_BYTES = 1 << 20
_NO_SPACE = "No space left on device"
# A damaged file as RocksDB names it in a status or in its info log.
_DAMAGED_FILE = re.compile(r"(/[^\s:;,]+\.(?:sst|log|ldb)|MANIFEST-\d+)")


def translate(exc: Exception, *, directory: Path | None = None) -> StorageError:
    """rocksdict's exception as the port's error; for corruption, the
    damaged file as RocksDB named it (in the status, or else in the last
    corruption its info log in `directory` reports)."""
    text = str(exc)
    if _NO_SPACE in text:
        return DiskFullError(text)
    if "Corruption" in text:
        found = _DAMAGED_FILE.search(text)
        path = found.group(1) if found else _damaged_file_in_info_log(directory)
        return CorruptionError(text, path=path)
    return StorageError(text)


def _damaged_file_in_info_log(directory: Path | None) -> str | None:
    """The file of the last corruption RocksDB's info log (LOG) reports:
    a failed open's status does not always name it ("Corruption: checksum
    mismatch" of a write-ahead log record)."""
    if directory is None:
        return None
    try:
        lines = (directory / "LOG").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if "Corruption" in line and (found := _DAMAGED_FILE.search(line)):
            return found.group(1)
    return None


class RocksStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._db: rocksdict.Rdict | None = None
        self._open()
        self._closed = False

    def _open(self) -> None:
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_compression_type(rocksdict.DBCompressionType.none())
        options.set_paranoid_checks(True)
        options.set_wal_recovery_mode(rocksdict.DBRecoveryMode.tolerate_corrupted_tail_records())
        try:
            db = rocksdict.Rdict(str(self.path), options)
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare Exceptions
            raise translate(exc, directory=self.path) from exc
        write_options = rocksdict.WriteOptions()
        write_options.sync = False
        db.set_write_options(write_options)
        self._db = db

    @property
    def _open_db(self) -> rocksdict.Rdict:
        if self._db is None:
            raise StorageError(f"the database in {self.path} is not open (a reopen failed)")
        return self._db

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
        try:
            self._open_db.write(batch)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare Exceptions
            raise translate(exc, directory=self.path) from exc

    def sync(self) -> None:
        try:
            self._open_db.flush_wal(True)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, directory=self.path) from exc

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self._open_db.get(key)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, directory=self.path) from exc
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        read_options = rocksdict.ReadOptions()
        read_options.set_iterate_upper_bound(end)
        it = self._open_db.iter(read_options)
        try:
            it.seek(start)
            while it.valid():
                yield it.key(), it.value()
                it.next()
            # A damaged block ends the iteration as if the range had ended.
            it.status()
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare Exceptions
            raise translate(exc, directory=self.path) from exc
        finally:
            # Drop the iterator now: a live one pins memtables and keeps the
            # database from closing.
            del it

    def seek_for_prev(self, key: bytes, lower_bound: bytes) -> tuple[bytes, bytes] | None:
        it = self._open_db.iter()
        try:
            it.seek_for_prev(key)
            # Checked here rather than with iterate_lower_bound, which
            # rocksdict's seek_for_prev does not honor.
            if not it.valid():
                it.status()
                return None
            found = it.key()
            if found < lower_bound:
                return None
            return found, it.value()
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, directory=self.path) from exc
        finally:
            del it

    def locate(self, key: bytes) -> str | None:
        """The table file whose key range holds `key`, else the write-ahead
        log (a key not yet flushed to a table file)."""
        try:
            files = self._open_db.live_files()
        except Exception:  # noqa: BLE001 - only for a message
            return None
        for found in files:
            if found["start_key"] <= key <= found["end_key"]:
                return str(self.path / str(found["name"]).lstrip("/"))
        logs = sorted(self.path.glob("*.log"))
        return str(logs[-1]) if logs else None

    def room_to_reopen(self) -> bool:
        """Free space for the write-ahead logs a reopen replays into a
        table file, plus a margin."""
        try:
            stats = os.statvfs(self.path)
            logs = sum(p.stat().st_size for p in self.path.glob("*.log"))
        except OSError:
            return False
        return stats.f_bavail * stats.f_frsize >= logs + REOPEN_MARGIN_BYTES

    def reopen(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except Exception as exc:  # noqa: BLE001 - after a failed write close reports it again
                log.info("closing %s before reopening it: %s", self.path, exc)
        self._open()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        db, self._db = self._db, None
        if db is None:
            return
        # Closed even when the sync fails (after a failed write it reports
        # that failure again), so that the lock file is released.
        try:
            db.flush_wal(True)
        except Exception as exc:  # noqa: BLE001
            log.warning("syncing the write-ahead log of %s at close failed: %s", self.path, exc)
        try:
            db.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("closing %s failed: %s", self.path, exc)
