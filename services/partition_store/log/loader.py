"""Recovery: rebuilds one partition's memory from what RocksDB holds when the
partition opens (a start, a reopen after a full disk, a follower's
truncation), and returns its PartitionRuntime (log/partition.py). Kafka's
LogLoader, kept apart from the partition that serves the log.

What it reads, each with a slower fallback when a value does not decode:
the log bounds and stored size (the partition meta, else a scan of the
log), the producer state (the newest good snapshot, else an older one, else
none, plus a replay of the batches after it through the partition's own
`_replay`, as live appends run), the aborted-transaction index (its `A`
keys, else a replay of the whole log), the leader-epoch cache and the
compaction state (its `K` key, else the whole log counts as dirty).

Owns nothing once the partition is returned: it keeps no state between
calls."""

from __future__ import annotations

import logging

from oncelog.wire.records import control_marker, read_header

from ...common.kernel.invariants import invariant
from .. import metrics
from ..core.codec import CorruptValueError, decode_partition_meta
from ..core.compaction import CompactionState, decode_compaction_state, initial_state
from ..core.leader_epochs import LeaderEpochCache, decode_epoch_entry
from ..core.log_state import LogState
from ..core.producer_state import ProducerStateManager
from ..core.snapshot import SnapshotError, decode_snapshot
from ..core.topics import TopicRecord
from ..core.txn_index import AbortedIndex, AbortedTxn, decode_aborted_txn
from ..storage import keys
from ..storage.port import KeyValueStore
from .partition import PartitionRuntime

# Recovery's messages keep the partition's logger, which operators and
# tests filter on: moving the code here did not change what it reports.
log = logging.getLogger("oncelog.partition_store.partition")

_MAX_KEY_TAIL = (1 << 64) - 1


def recover_partition(
    topic: TopicRecord, partition: int, store: KeyValueStore, *, now_ms: int,
    producer_id_expiration_ms: int, replicated: bool = False,
) -> PartitionRuntime:
    """Loads the newest good snapshot and the aborted index, and replays
    the batches after the snapshot. A snapshot that does not decode falls
    back to the one before it; with none left, the replay starts at the
    log start offset.

    A single copy's HW is its stored log end (everything stored was
    acknowledged or may be). A replica's (`replicated`) starts at its log
    start and is learned again, from the leader's answers or, as leader,
    from the followers' fetches: its stored log may end in a tail that no
    other replica has and that was never committed (a deposed leader's,
    or one truncation is about to cut), and an HW over that tail would
    let compaction drop a committed record in favour of an uncommitted
    one, or keep the tail when a truncation falls back to the HW. Kafka
    restores a checkpointed HW instead; there is none here."""
    tp = topic.topic_partition(partition)
    tid = topic.topic_id
    log_prefix = keys.partition_prefix(keys.LOG, tid, partition)
    log_end_key = keys.log_key_end(tid, partition)

    log_start, size_bytes = _recover_meta(store, topic, partition)
    last = store.seek_for_prev(keys.log_key(tid, partition, _MAX_KEY_TAIL), log_prefix)
    last_header = read_header(last[1]) if last is not None else None
    stored_end = last_header.next_offset if last_header is not None else log_start
    log_end = max(log_start, stored_end)

    snapshot_prefix = keys.partition_prefix(keys.SNAPSHOT, tid, partition)
    stored_snapshots = list(store.scan(snapshot_prefix, keys.next_prefix(snapshot_prefix)))
    snapshot = None
    corrupt = 0
    for key, value in reversed(stored_snapshots):
        key_offset = keys.snapshot_key_offset(key)
        try:
            candidate = decode_snapshot(value)
            if candidate.offset != key_offset:
                raise SnapshotError(
                    f"snapshot under offset {key_offset} says offset {candidate.offset}"
                )
            if candidate.offset > log_end:
                raise SnapshotError(
                    f"snapshot offset {candidate.offset} beyond the log end {log_end}"
                )
        except SnapshotError as exc:
            corrupt += 1
            metrics.CORRUPT_SNAPSHOTS.inc()
            log.warning("%s: skipping snapshot at offset %d: %s", tp, key_offset, exc)
            continue
        snapshot = candidate
        break

    producers = ProducerStateManager(tp, snapshot.producers if snapshot else (),
                                     snapshot.unreplicated if snapshot else ())
    replay_from = max(snapshot.offset if snapshot else log_start, log_start)
    running_max_ts = None
    time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, partition)
    last_time = store.seek_for_prev(
        keys.time_index_key(tid, partition, (1 << 63) - 1), time_prefix
    )
    if last_time is not None:
        running_max_ts = keys.time_index_key_timestamp(last_time[0])
    log_state = LogState(
        tp, log_start_offset=log_start, log_end_offset=replay_from,
        high_watermark=log_start if replicated else replay_from,
        durable_end_offset=replay_from, size_bytes=size_bytes,
        max_timestamp_ms=running_max_ts,
    )
    aborted = _recover_aborted_index(store, topic, partition, log_start, log_end)
    epoch_prefix = keys.partition_prefix(keys.LEADER_EPOCH, tid, partition)
    epochs = LeaderEpochCache(tp, (
        decode_epoch_entry(value, what=f"{tp} leader-epoch entry")
        for _key, value in store.scan(epoch_prefix, keys.next_prefix(epoch_prefix))
    ))
    part = PartitionRuntime(
        topic, partition, store, producers=producers, log_state=log_state,
        snapshot_offsets=[keys.snapshot_key_offset(k) for k, _v in stored_snapshots],
        aborted=aborted,
        compaction=_recover_compaction(store, topic, partition, log_start, log_end),
        last_batch_base_offset=(
            last_header.base_offset if last_header is not None else log_start
        ),
        epochs=epochs,
    )
    replayed = 0
    for key, value in store.scan(keys.log_key(tid, partition, replay_from), log_end_key):
        header = read_header(value)
        key_offset = keys.log_key_offset(key)
        if key_offset != header.base_offset:
            invariant(
                False, f"{tp}: batch stored under offset {key_offset} "
                f"says base offset {header.base_offset}",
            )
        part.replay_stored(
            header, control_marker(value) if header.is_control else None, now_ms,
        )
        replayed += 1
    invariant(
        log_state.log_end_offset == log_end,
        lambda: f"{tp}: replay ended at {log_state.log_end_offset}, log ends at {log_end}",
    )
    # Everything stored counts as durable: it survived the restart (and
    # with a single copy, as committed: see the docstring).
    if replicated:
        log_state.mark_locally_durable(log_end)
    else:
        log_state.mark_durable(log_end)
    producers.on_high_watermark(log_state.high_watermark)
    # Recovered producers count as active now (see producer_state.py).
    producers.remove_expired(now_ms, producer_id_expiration_ms)
    part.sync_unstable()
    part.update_txn_age(now_ms)

    part.recovery_replayed_batches = replayed
    part.recovery_snapshot_offset = snapshot.offset if snapshot else None
    part.recovery_corrupt_snapshots = corrupt
    # The replay marked a snapshot due if it replayed anything (a newer one
    # spares the next start that replay); the snapshot clock starts now.
    part.batches_since_snapshot = replayed
    part.last_snapshot_ms = now_ms
    if replayed or corrupt:
        log.info(
            "%s: recovered from %s, replayed %d batches (%d corrupt snapshots skipped), "
            "log [%d, %d), %d open transactions, %d aborted transactions indexed", tp,
            f"snapshot at {snapshot.offset}" if snapshot else "the log start",
            replayed, corrupt, log_start, log_end, producers.open_txn_count, len(aborted),
        )
    return part


def _recover_aborted_index(
    store: KeyValueStore, topic: TopicRecord, partition: int, log_start: int, log_end: int,
) -> AbortedIndex:
    """The aborted index from its `A` keys. If one does not decode, the
    index is rebuilt by replaying the whole stored log into a scratch
    producer table (a rare, slow path, like _recover_meta's)."""
    tp = topic.topic_partition(partition)
    prefix = keys.partition_prefix(keys.ABORTED_TXN, topic.topic_id, partition)
    index = AbortedIndex(tp)
    try:
        for key, value in store.scan(prefix, keys.next_prefix(prefix)):
            last_offset = keys.aborted_txn_key_offset(key)
            index.add(decode_aborted_txn(last_offset, value, what=f"{tp} aborted index"))
        return index
    except CorruptValueError as exc:
        log.warning("%s: rebuilding the aborted index by scanning the log: %s", tp, exc)
    index = AbortedIndex(tp)
    scratch = ProducerStateManager(tp)
    tid = topic.topic_id
    for _key, value in store.scan(
        keys.log_key(tid, partition, log_start), keys.log_key_end(tid, partition)
    ):
        header = read_header(value)
        completed = scratch.replay(
            header, header.base_offset, 0,
            control=control_marker(value) if header.is_control else None,
        )
        if completed is not None and completed.aborted:
            index.add(AbortedTxn(
                completed.producer_id, completed.first_offset, completed.last_offset,
                completed.last_stable_offset,
            ))
    invariant(
        not index.entries() or index.entries()[-1].last_offset < log_end,
        lambda: f"{tp}: aborted index rebuilt past the log end {log_end}",
    )
    return index


def _recover_compaction(
    store: KeyValueStore, topic: TopicRecord, partition: int, log_start: int, log_end: int,
) -> CompactionState:
    """The cleaning progress from its `K` key. Missing or damaged: the
    whole log counts as dirty (the next pass cleans it again, and
    tombstones get a full delete.retention.ms from then: safe, later)."""
    tp = topic.topic_partition(partition)
    raw = store.get(keys.compaction_key(topic.topic_id, partition))
    if raw is None:
        return initial_state(log_start)
    try:
        state = decode_compaction_state(raw, what=f"{tp} compaction state")
    except CorruptValueError as exc:
        log.warning("%s: compaction state unreadable, cleaning from the log start: %s",
                    tp, exc)
        return initial_state(log_start)
    if not log_start <= state.clean_offset <= log_end:
        log.warning("%s: compaction state's clean offset %d is outside the log [%d, %d]; "
                    "cleaning from the log start", tp, state.clean_offset, log_start, log_end)
        return initial_state(log_start)
    return state


def _recover_meta(store: KeyValueStore, topic: TopicRecord, partition: int) -> tuple[int, int]:
    """(log start offset, stored size) from the partition meta; rebuilt by a
    scan of the log if it is missing or damaged (a rare, slow path)."""
    tp = topic.topic_partition(partition)
    raw = store.get(keys.meta_key(topic.topic_id, partition))
    if raw is not None:
        try:
            return decode_partition_meta(raw, what=f"{tp} partition meta")
        except CorruptValueError as exc:
            log.warning("%s: rebuilding partition meta by scanning the log: %s", tp, exc)
    prefix = keys.partition_prefix(keys.LOG, topic.topic_id, partition)
    start = None
    size = 0
    for _key, value in store.scan(prefix, keys.next_prefix(prefix)):
        if start is None:
            start = read_header(value).base_offset
        size += len(value)
    return (start or 0), size
