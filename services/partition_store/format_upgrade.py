"""The one-time rewrite of a store written in the fixed-width record format.

Stores kept batches in a first record format (core/fixed_width.py) before
Kafka's varint records (oncelog.wire.records). A store that opens a
database without the `F` key (storage/keys.py) rewrites every stored batch
before it recovers any partition: same key, same header fields (base
offset, partition_leader_epoch, producer fields, timestamps, counts), the
records in Kafka's format, a new length and CRC. Then it writes `F`. A
database that never held a batch gets `F` at once.

Crash safety: the batches are rewritten in key order, in chunks of about
`chunk_bytes`, each one WriteGroup that also holds `U`, the key of the
chunk's last batch, and the partition meta (`M`: the stored size changes)
and compaction state (`K`: so do the bytes below the clean offset) of the
partitions the chunk touched. A kill -9 leaves every chunk written whole or
not at all, and a restart goes on after `U`: no batch is converted twice,
none is skipped. The last chunk deletes `U` and writes `F` with it.

Nothing else changes: offsets, the time index, the aborted index, the
leader-epoch cache and producer-state snapshots all name offsets, which stay.
A batch that does not read as the fixed-width format (damaged bytes) is kept
as it was and logged: readers check its CRC and refuse it then, as they
would have before.

Runs on the event loop before the store serves anything (runtime.start),
so nothing reads or writes the log meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from ..common.kernel.crashpoints import crash_point
from .core.codec import (
    CorruptValueError,
    decode_offset,
    decode_partition_meta,
    encode_offset,
    encode_partition_meta,
    seal,
    unseal,
)
from .core.compaction import decode_compaction_state, encode_compaction_state
from .core.fixed_width import FixedWidthFormatError, convert_fixed_width_batch
from .storage import keys
from .storage.port import KeyValueStore, WriteGroup

log = logging.getLogger("oncelog.partition_store.format_upgrade")

# The format of stored batches that `F` names: Kafka's record batch v2 with
# varint records. (1, the fixed-width records, is never written: it is what
# a database without `F` holds.)
LOG_FORMAT_VARINT = 2
# Bytes of batches per WriteGroup of the rewrite.
UPGRADE_CHUNK_BYTES = 4 * 1024 * 1024
_PROGRESS_VERSION = 1


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    """What one run of the rewrite did."""

    # True when the database had `F` already: nothing was read.
    already_current: bool
    batches_converted: int = 0
    # Batches kept as they were: they did not read as the fixed-width format.
    batches_kept: int = 0
    chunks: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    # The run went on after a crash of an earlier one.
    resumed: bool = False


def log_format(store: KeyValueStore) -> int | None:
    """The format `F` names, None when it is absent (the fixed-width format,
    or a rewrite that has not finished)."""
    raw = store.get(keys.LOG_FORMAT)
    return None if raw is None else decode_offset(raw, what="log format version")


def upgrade_log_format(
    store: KeyValueStore, *, chunk_bytes: int = UPGRADE_CHUNK_BYTES,
) -> UpgradeReport:
    """Rewrites every stored batch in Kafka's record format unless `F` says
    it is done (see the module docstring), then writes `F`."""
    found = log_format(store)
    if found == LOG_FORMAT_VARINT:
        return UpgradeReport(already_current=True)
    if found is not None:
        raise RuntimeError(
            f"the database's log format version is {found}; this store reads "
            f"{LOG_FORMAT_VARINT} (or converts a database without one)"
        )
    started_s = time.perf_counter()
    progress = store.get(keys.LOG_FORMAT_UPGRADE)
    resumed = progress is not None
    start = keys.LOG_START if progress is None else _after(_decode_progress(progress))
    converted = kept = chunks = before = after = 0
    while True:
        chunk = _Chunk()
        last_key: bytes | None = None
        for key, value in store.scan(start, keys.LOG_END):
            chunk.add(key, value)
            last_key = key
            if chunk.bytes_before >= chunk_bytes:
                break
        if last_key is None:
            break
        group = chunk.writes(store)
        group.put(keys.LOG_FORMAT_UPGRADE, _encode_progress(last_key))
        store.write(group)
        chunks += 1
        converted += chunk.converted
        kept += chunk.kept
        before += chunk.bytes_before
        after += chunk.bytes_after
        start = _after(last_key)
        # Tests stop the process here to check that a rewrite cut short
        # goes on where it stopped (tests/integration/test_format_upgrade.py).
        crash_point("format_upgrade.after_chunk")
    done = WriteGroup()
    done.delete(keys.LOG_FORMAT_UPGRADE)
    done.put(keys.LOG_FORMAT, encode_offset(LOG_FORMAT_VARINT))
    store.write(done)
    store.sync()
    report = UpgradeReport(
        already_current=False, batches_converted=converted, batches_kept=kept, chunks=chunks,
        bytes_before=before, bytes_after=after, resumed=resumed,
    )
    if converted or kept or resumed:
        log.info(
            "rewrote %d stored batches in Kafka's record format (%d kept as they were, "
            "%d chunks, %d -> %d bytes%s) in %.1f s", converted, kept, chunks, before, after,
            ", resumed after an interrupted run" if resumed else "",
            time.perf_counter() - started_s,
        )
    return report


class _Chunk:
    """The converted batches of one WriteGroup and what they change per
    partition."""

    def __init__(self) -> None:
        self.puts: list[tuple[bytes, bytes]] = []
        self.converted = 0
        self.kept = 0
        self.bytes_before = 0
        self.bytes_after = 0
        # (topic_id, partition) -> [(base_offset, size change)].
        self.changes: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def add(self, key: bytes, value: bytes) -> None:
        self.bytes_before += len(value)
        try:
            new = convert_fixed_width_batch(value)
        except FixedWidthFormatError as exc:
            topic_id, partition = keys.log_key_partition(key)
            log.error(
                "topic id %d partition %d: the batch at offset %d does not read as the "
                "fixed-width format and is kept as it was (readers will refuse it): %s",
                topic_id, partition, keys.log_key_offset(key), exc,
            )
            self.kept += 1
            self.bytes_after += len(value)
            return
        self.converted += 1
        self.bytes_after += len(new)
        self.puts.append((key, new))
        self.changes.setdefault(keys.log_key_partition(key), []).append(
            (keys.log_key_offset(key), len(new) - len(value))
        )

    def writes(self, store: KeyValueStore) -> WriteGroup:
        """The batches, and the partition meta and compaction state of each
        partition they belong to with their sizes updated."""
        group = WriteGroup()
        for key, value in self.puts:
            group.put(key, value)
        for (topic_id, partition), changes in self.changes.items():
            growth = sum(change for _offset, change in changes)
            meta_key = keys.meta_key(topic_id, partition)
            raw = store.get(meta_key)
            if raw is not None:
                try:
                    start, size = decode_partition_meta(raw, what="partition meta")
                except CorruptValueError:
                    pass  # recovery rebuilds it by scanning the log
                else:
                    group.put(meta_key, encode_partition_meta(start, max(0, size + growth)))
            state_key = keys.compaction_key(topic_id, partition)
            raw = store.get(state_key)
            if raw is not None:
                try:
                    state = decode_compaction_state(raw, what="compaction state")
                except CorruptValueError:
                    continue  # recovery starts cleaning from the log start
                below = sum(change for offset, change in changes if offset < state.clean_offset)
                if below:
                    group.put(state_key, encode_compaction_state(dataclasses.replace(
                        state, clean_bytes=max(0, state.clean_bytes + below),
                    )))
        return group


def _after(key: bytes) -> bytes:
    """The smallest key after `key`."""
    return key + b"\x00"


def _encode_progress(key: bytes) -> bytes:
    return seal(_PROGRESS_VERSION, key)


def _decode_progress(raw: bytes) -> bytes:
    key = unseal(raw, version=_PROGRESS_VERSION, what="log format rewrite progress")
    if not key.startswith(keys.LOG):
        raise CorruptValueError(f"log format rewrite progress names {key!r}, not a log key")
    return key

