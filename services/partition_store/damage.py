"""Damaged storage: what a store does when its files fail their checksums
(docs/partition-store.md, "Damaged and full disks").

Where damage is found:
* opening RocksDB (storage/rocksdb.py): a table file cut short, a
  write-ahead-log record that fails its checksum before the log's end;
* any read: RocksDB's block checksums, and a stored batch's own CRC32C,
  checked on every batch a fetch or a replica fetch reads
  (log/partition.py), so damaged bytes are never served nor copied;
* with --verify-checksums-on-start, every stored key at start
  (`verify_checksums`), for damage in data that recovery does not read.

What it does. A store that finds damage while it runs records it in
`<data-dir>/DAMAGED` (the file and RocksDB's words) and stops at once
(exit code EXIT_DAMAGED): it serves nothing more, and its partitions move
to other replicas as after a crash. At the next start (`open_store`),
damage found then or recorded before decides:
* single copies: the store refuses to start, naming the damaged file; its
  data is the only copy there is, so an operator decides (restore the
  directory from a backup, or move it aside and lose its records);
* replicated: when every partition it holds has another in-sync replica,
  the damaged database is moved aside (`rocksdb.damaged-<time>`, kept for
  inspection) and the store starts empty: the restart path of a replaced
  disk, which leaves every ISR and copies each replica from its leader.
  When it holds the only in-sync copy of a partition it refuses to start
  as a single copy does, naming the file and those partitions.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from .core.batches import stored_batch_damage
from .storage import keys
from .storage.port import CorruptionError, KeyValueStore
from .storage.rocksdb import RocksStore

log = logging.getLogger("oncelog.partition_store.damage")

ROCKSDB_DIR = "rocksdb"
MARKER_FILE = "DAMAGED"
QUARANTINE_PREFIX = "rocksdb.damaged-"
# The exit code of a store that stopped because its data is damaged.
EXIT_DAMAGED = 3


class DamagedDataError(SystemExit):
    """The store refuses to start: its data is damaged and no other replica
    can replace it. The message names the file."""


@dataclass(frozen=True, slots=True)
class Damage:
    """What was found: the damaged file (when known) and the storage
    engine's or our own words."""

    path: str | None
    message: str

    @classmethod
    def of(cls, error: CorruptionError) -> Damage:
        return cls(error.path, str(error))

    def describe(self) -> str:
        where = self.path or "a file the storage engine did not name"
        return f"{where}: {self.message}"


def verify_checksums(store: KeyValueStore) -> int:
    """Reads every stored key (RocksDB checks each block's checksum) and
    checks every stored batch's CRC32C; returns the number of batches.
    Raises CorruptionError naming the first damage found."""
    batches = 0
    for key, value in store.scan(keys.KEYSPACE_START, keys.KEYSPACE_END):
        if key[:1] != keys.LOG:
            continue
        damage = stored_batch_damage(value)
        if damage is not None:
            raise CorruptionError(f"log key {key.hex()}: {damage}", path=store.locate(key))
        batches += 1
    return batches


def read_marker(data_dir: Path) -> Damage | None:
    """The damage a previous run recorded before it stopped, if any."""
    marker = data_dir / MARKER_FILE
    try:
        doc = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return Damage(None, f"{marker} exists but cannot be read ({exc})")
    return Damage(doc.get("path"), str(doc.get("message", "")))


def record_and_stop(data_dir: Path, node_id: int, error: CorruptionError) -> None:
    """A running store found damage: records it for the next start and
    stops at once, serving nothing more (the module docstring)."""
    damage = Damage.of(error)
    try:
        (data_dir / MARKER_FILE).write_text(json.dumps(
            {"path": damage.path, "message": damage.message, "time_ms": int(time.time() * 1000)}))
    except OSError as exc:
        log.error("cannot record the damage in %s: %s", data_dir / MARKER_FILE, exc)
    log.critical("store node %d: stored data is damaged (%s); stopping so that nothing of it "
                 "is served or replicated. The next start decides what to do "
                 "(docs/partition-store.md, 'Damaged and full disks')", node_id,
                 damage.describe())
    logging.shutdown()
    os._exit(EXIT_DAMAGED)


async def open_store(
    data_dir: Path, *, node_id: int, verify: bool,
    sole_copies: Callable[[], Awaitable[list[str]]] | None,
) -> RocksStore:
    """The store's RocksDB, opened and (with `verify`) checked. On damage,
    found now or recorded by the previous run: single copies
    (`sole_copies` None) refuse to start; replicated stores start empty
    when `sole_copies()` (the partitions whose only in-sync replica is
    this store) is empty, else refuse too. Raises DamagedDataError."""
    path = data_dir / ROCKSDB_DIR
    damage = read_marker(data_dir)
    if damage is None:
        store: RocksStore | None = None
        try:
            store = RocksStore(path)
            if verify:
                started = time.monotonic()
                checked = verify_checksums(store)
                log.info("store node %d: %d stored batches checked in %.1f s, all intact",
                         node_id, checked, time.monotonic() - started)
            return store
        except CorruptionError as exc:
            damage = Damage.of(exc)
            if store is not None:
                store.close()
    refusal = (f"partition store {node_id} cannot start: its data in {path} is damaged "
               f"({damage.describe()})")
    if sole_copies is None:
        raise DamagedDataError(
            f"{refusal}. It holds the only copy of its partitions, so it will not serve "
            f"from it: restore {data_dir} from a backup, or move it aside to start empty "
            f"(its records are lost)")
    try:
        sole = await sole_copies()
    except Exception as exc:  # noqa: BLE001 - any failure means: cannot tell
        raise DamagedDataError(
            f"{refusal}, and whether other replicas hold its partitions cannot be told "
            f"(the metadata store: {exc}); start it again once the metadata store is "
            f"reachable") from exc
    if sole:
        raise DamagedDataError(
            f"{refusal}. It is the only in-sync replica of {', '.join(sole)}, so it will "
            f"not start empty: restore {data_dir} from a backup, or move it aside to lose "
            f"those partitions' records (an unclean leader election)")
    aside = data_dir / f"{QUARANTINE_PREFIX}{time.strftime('%Y%m%dT%H%M%S')}"
    if path.exists():
        path.rename(aside)
    else:
        aside.mkdir()
    marker = data_dir / MARKER_FILE
    if marker.exists():
        marker.rename(aside / MARKER_FILE)
    log.warning("store node %d: its data was damaged (%s); moved it to %s and starts empty: "
                "every replica it holds is copied again from its leader", node_id,
                damage.describe(), aside)
    return RocksStore(path)
