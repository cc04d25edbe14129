"""The RocksDB key layout of the partition store, written down once.

Every integer is big-endian and unsigned-encoded so keys sort numerically.
topic_id (8 bytes) is the catalog's id, never the name, so a deleted and
re-created topic never sees the old topic's data.

  L | topic_id(8) | partition(4) | base_offset(8)  -> an encoded batch (base_offset set)
  S | topic_id(8) | partition(4) | offset(8)       -> producer-state snapshot as of offset
  M | topic_id(8) | partition(4)                   -> partition meta: log start offset
                                                      and stored size (core/codec.py)
  T | topic_id(8) | partition(4) | max_ts(8)       -> base offset of the batch that raised
                                                      the partition's running max timestamp
                                                      to max_ts (sign bit flipped so
                                                      negative timestamps sort first)
  A | topic_id(8) | partition(4) | last_offset(8)  -> an aborted transaction that an ABORT
                                                      marker at last_offset ended: producer
                                                      id, first offset, LSO after the marker
                                                      (core/txn_index.py)
  K | topic_id(8) | partition(4)                   -> compaction state of a compacted partition:
                                                      clean offset, clean bytes, cleaning
                                                      history (core/compaction.py)
  E | topic_id(8) | partition(4) | epoch(4)        -> start offset of the leader epoch `epoch`
                                                      on this replica's log (one entry of the
                                                      leader-epoch cache, core/leader_epochs.py)
  C | topic name (utf-8)                           -> topic catalog record (core/topics.py)
  N                                                -> next topic id (controller only)
  F                                                -> the record format of every stored
                                                      batch (sealed int64: 2, Kafka's varint
                                                      records); absent: the fixed-width
                                                      records of the first format
  U                                                -> the `L` key of the last batch an
                                                      unfinished rewrite to format 2 has
                                                      converted (format_upgrade.py)

`A` entries are written in the same WriteBatch as their marker, so the
aborted index on disk always matches the markers in the log; retention
deletes those with last_offset below the new log start (range delete up to
A|..|new_start) in the same WriteBatch as the batches.

Compaction rewrites `L` values in place (same key, fewer records) or
deletes them, deletes the `A` entry of a removed ABORT marker, and writes
`M` and `K`, each chunk in one WriteBatch.

`E` entries mirror the partition's leader-epoch cache, written in the same
WriteBatch as the log change that changed the cache (a batch of a new
epoch, a truncation of the log's end or start); core/leader_epochs.py says
how.

`F` is written when a store first starts on a database (empty or
rewritten); until then `U` tracks the rewrite, written in the same
WriteBatch as the batches it converted, so after a crash the rewrite goes on
after that key: no batch converted twice, none skipped.

Values other than batches are sealed (version byte + CRC32C, core/codec.py).
ListOffsets by timestamp seeks to the first T key >= ts: every batch before
that entry's batch has only records older than ts, so the answer lies in that
batch or after it.
"""

from __future__ import annotations

import struct

LOG = b"L"
SNAPSHOT = b"S"
META = b"M"
TIME_INDEX = b"T"
ABORTED_TXN = b"A"
COMPACTION = b"K"
LEADER_EPOCH = b"E"
CATALOG = b"C"
TOPIC_ID_COUNTER = b"N"
LOG_FORMAT = b"F"
LOG_FORMAT_UPGRADE = b"U"
# Every kind whose keys start with topic_id | partition: a partition's data.
PARTITION_KINDS = (LOG, SNAPSHOT, META, TIME_INDEX, ABORTED_TXN, COMPACTION, LEADER_EPOCH)

_TOPIC = struct.Struct(">Q")
_PARTITION = struct.Struct(">QI")
_TAIL = struct.Struct(">Q")
_EPOCH = struct.Struct(">I")
_SIGN_BIT = 1 << 63
_MAX_U64 = (1 << 64) - 1
PARTITION_KEY_SIZE = 1 + _PARTITION.size
ENTRY_KEY_SIZE = PARTITION_KEY_SIZE + _TAIL.size


def next_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with prefix."""
    data = bytearray(prefix)
    while data and data[-1] == 0xFF:
        data.pop()
    if not data:
        raise ValueError("no key follows a prefix of only 0xff bytes")
    data[-1] += 1
    return bytes(data)


def partition_prefix(kind: bytes, topic_id: int, partition: int) -> bytes:
    return kind + _PARTITION.pack(topic_id, partition)


def topic_prefix(kind: bytes, topic_id: int) -> bytes:
    return kind + _TOPIC.pack(topic_id)


def topic_ranges(topic_id: int) -> list[tuple[bytes, bytes]]:
    """[start, end) of every key that holds data of a topic (for deletion)."""
    ranges = []
    for kind in PARTITION_KINDS:
        prefix = topic_prefix(kind, topic_id)
        ranges.append((prefix, next_prefix(prefix)))
    return ranges


def _entry(kind: bytes, topic_id: int, partition: int, tail: int) -> bytes:
    return kind + _PARTITION.pack(topic_id, partition) + _TAIL.pack(tail)


def _tail(key: bytes) -> int:
    return int(_TAIL.unpack_from(key, PARTITION_KEY_SIZE)[0])


def log_key(topic_id: int, partition: int, base_offset: int) -> bytes:
    return _entry(LOG, topic_id, partition, base_offset)


def log_key_end(topic_id: int, partition: int) -> bytes:
    return next_prefix(partition_prefix(LOG, topic_id, partition))


def log_key_offset(key: bytes) -> int:
    return _tail(key)


def log_key_partition(key: bytes) -> tuple[int, int]:
    """(topic_id, partition) of an `L` key."""
    topic_id, partition = _PARTITION.unpack_from(key, len(LOG))
    return int(topic_id), int(partition)


LOG_START = LOG
LOG_END = next_prefix(LOG)


def snapshot_key(topic_id: int, partition: int, offset: int) -> bytes:
    return _entry(SNAPSHOT, topic_id, partition, offset)


def snapshot_key_offset(key: bytes) -> int:
    return _tail(key)


def aborted_txn_key(topic_id: int, partition: int, last_offset: int) -> bytes:
    return _entry(ABORTED_TXN, topic_id, partition, last_offset)


def aborted_txn_key_offset(key: bytes) -> int:
    return _tail(key)


def meta_key(topic_id: int, partition: int) -> bytes:
    return partition_prefix(META, topic_id, partition)


def compaction_key(topic_id: int, partition: int) -> bytes:
    return partition_prefix(COMPACTION, topic_id, partition)


def leader_epoch_key(topic_id: int, partition: int, epoch: int) -> bytes:
    """The key of one leader-epoch cache entry (epoch >= 0, as an unsigned
    int32, so a partition's entries sort by epoch)."""
    return partition_prefix(LEADER_EPOCH, topic_id, partition) + _EPOCH.pack(epoch)


def leader_epoch_key_epoch(key: bytes) -> int:
    return int(_EPOCH.unpack_from(key, PARTITION_KEY_SIZE)[0])


def encode_timestamp(timestamp_ms: int) -> int:
    return (timestamp_ms + _SIGN_BIT) & _MAX_U64


def time_index_key(topic_id: int, partition: int, max_timestamp_ms: int) -> bytes:
    return _entry(TIME_INDEX, topic_id, partition, encode_timestamp(max_timestamp_ms))


def time_index_key_timestamp(key: bytes) -> int:
    return _tail(key) - _SIGN_BIT


def catalog_key(name: str) -> bytes:
    return CATALOG + name.encode()


def catalog_key_name(key: bytes) -> str:
    return key[len(CATALOG):].decode()


CATALOG_START = CATALOG
CATALOG_END = next_prefix(CATALOG)
# Below and above every key of this layout (each starts with an ASCII
# letter): a scan of everything (damage.verify_checksums).
KEYSPACE_START = b""
KEYSPACE_END = b"\x7f"
