"""Records of `__consumer_offsets`, and the state that replaying them yields.

Keys (first byte tells the kind; values are versioned, CRC-sealed JSON):

    E                          -> a group coordinator took the partition over:
                                  {"coordinator_epoch": n, "node_id": k}
    G | group id               -> the group's membership, None when the group
                                  was deleted or expired: a server-assigned
                                  group (groups.Group), or a classic group
                                  (classic.snapshot: Kafka's GroupMetadata
                                  record, tagged "type": "classic"). One key
                                  per group id: a group has one type at a time
    O | [group, topic, part]   -> a committed offset {"offset", "metadata",
                                  "commit_ms"}, None when removed

Offset records arrive two ways: in plain batches (OffsetCommit, applied at
once) and in transactional batches of a producer (TxnOffsetCommit), which stay
pending until that producer's COMMIT or ABORT marker — written to this
partition by the transaction coordinator — is replayed. Replay sees markers
because the group coordinator reads its partitions with control batches.

Everything the group coordinator knows is derived by replaying the partition
in offset order, its own writes and others' markers alike, so a restarted or
replacement process rebuilds exactly the same state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from oncelog.wire.records import MARKER_COMMIT, next_sequence

from ...common.kernel import durable
from ...common.kernel.invariants import invariant
from ...common.shards.coordinator_epoch import EPOCH_KEY, decode_epoch
from . import classic
from .classic import AnyGroup, ClassicGroup
from .groups import Group

RECORD_VERSION = 1
GROUP_PREFIX = b"G"
OFFSET_PREFIX = b"O"

TP = tuple[str, int]
Entry = tuple[bytes, bytes | None]


def group_key(group_id: str) -> bytes:
    return GROUP_PREFIX + group_id.encode()


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return OFFSET_PREFIX + json.dumps([group_id, topic, partition]).encode()


def encode_group(group: Group) -> Entry:
    return group_key(group.group_id), durable.encode(RECORD_VERSION, group.to_payload())


def encode_classic_group(group: ClassicGroup) -> Entry:
    return group_key(group.group_id), durable.encode(RECORD_VERSION, classic.snapshot(group))


def encode_group_tombstone(group_id: str) -> Entry:
    return group_key(group_id), None


def encode_offset(group_id: str, tp: TP, offset: int, metadata: str, commit_ms: int) -> Entry:
    return offset_key(group_id, *tp), durable.encode(
        RECORD_VERSION, {"offset": offset, "metadata": metadata, "commit_ms": commit_ms}
    )


def encode_offset_tombstone(group_id: str, tp: TP) -> Entry:
    return offset_key(group_id, *tp), None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str
    commit_ms: int
    # Where the record that carried it sits in the log: a transactional
    # offset materializes only over an older one (Kafka's rule).
    log_offset: int


@dataclass(frozen=True, slots=True)
class ProducerWrites:
    """What this partition holds of a producer that wrote transactional
    offsets here, enough to give our next write of it the sequence number the
    partition store expects (the group coordinator is the only writer of data
    batches here, so it knows exactly)."""

    producer_epoch: int
    # Sequence of the next batch at producer_epoch (0 after a marker).
    next_sequence: int = 0


@dataclass(frozen=True, slots=True)
class BatchView:
    """One batch as replay needs it: from a fetch, or from our own append."""

    base_offset: int
    # Past the batch's last offset (from its header: records removed by
    # compaction leave gaps, so this is not always base + record count).
    next_offset: int
    producer_id: int
    producer_epoch: int
    # From the header (base sequence + last offset delta): compaction may
    # empty a batch but keeps its header, so not derived from the records.
    last_sequence: int
    is_transactional: bool
    is_control: bool
    # (offset, key, value) per record; for a control batch its marker type.
    records: Sequence[tuple[int, bytes | None, bytes | None]] = ()
    control_type: int = -1


@dataclass
class OffsetsPartitionState:
    coordinator_epoch: int = -1
    epoch_owner_node_id: int = -1
    groups: dict[str, AnyGroup] = field(default_factory=dict)
    offsets: dict[str, dict[TP, CommittedOffset]] = field(default_factory=dict)
    # producer id -> group -> partition -> pending offset
    pending: dict[int, dict[str, dict[TP, CommittedOffset]]] = field(default_factory=dict)
    producers: dict[int, ProducerWrites] = field(default_factory=dict)

    # ------------------------------------------------------------- queries

    def has_pending(self, group_id: str, tp: TP) -> bool:
        return any(tp in by_group.get(group_id, {}) for by_group in self.pending.values())

    def pending_count(self) -> int:
        return sum(len(p) for by_group in self.pending.values() for p in by_group.values())

    def next_sequence_for(self, producer_id: int, producer_epoch: int) -> int:
        seen = self.producers.get(producer_id)
        if seen is None or producer_epoch != seen.producer_epoch:
            return 0
        return seen.next_sequence

    def known_groups(self) -> set[str]:
        return set(self.groups) | {g for g, offs in self.offsets.items() if offs}

    # ------------------------------------------------ classic groups' live part

    def install_classic(self, group: ClassicGroup, *, persisted: bool) -> None:
        """Makes a classic group's value current. Its durable part is what
        replay of its last record gave (`persisted`: the record of this very
        value was just replayed); the live part — the rebalance under way,
        parked calls, deadlines — is never written (classic.py), so it is
        applied here, after the write if there was one."""
        if persisted:
            replayed = self.groups.get(group.group_id)
            invariant(
                isinstance(replayed, ClassicGroup)
                and classic.snapshot(replayed) == classic.snapshot(group),
                lambda: f"group {group.group_id!r}: the record just replayed is not the group "
                        "being installed",
            )
        self.groups[group.group_id] = group

    # -------------------------------------------------------------- replay

    def replay(self, batch: BatchView) -> None:
        """Applies one batch. Raises durable.CorruptValueError for a record it
        cannot read (a bug or a foreign writer: never skipped silently)."""
        if batch.is_control:
            self._replay_marker(batch)
            return
        if batch.producer_id >= 0 and batch.is_transactional:
            self.producers[batch.producer_id] = ProducerWrites(
                batch.producer_epoch, next_sequence(batch.last_sequence)
            )
            pending = self.pending.setdefault(batch.producer_id, {})
            for offset, key, value in batch.records:
                self._replay_offset(key, value, offset, into=pending)
            return
        for offset, key, value in batch.records:
            self._replay_record(key, value, offset)

    def _replay_marker(self, batch: BatchView) -> None:
        self.producers[batch.producer_id] = ProducerWrites(batch.producer_epoch, 0)
        pending = self.pending.pop(batch.producer_id, None)
        if not pending or batch.control_type != MARKER_COMMIT:
            return
        for group_id, by_tp in pending.items():
            committed = self.offsets.setdefault(group_id, {})
            for tp, value in by_tp.items():
                current = committed.get(tp)
                if current is None or current.log_offset < value.log_offset:
                    committed[tp] = value

    def _replay_record(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        if key == EPOCH_KEY:
            if value is None:
                return
            self.coordinator_epoch, self.epoch_owner_node_id = decode_epoch(value)
            return
        if key is not None and key.startswith(GROUP_PREFIX):
            group_id = key[len(GROUP_PREFIX):].decode()
            if value is None:
                self.groups.pop(group_id, None)
                return
            payload = durable.decode(value, expected_version=RECORD_VERSION,
                                     what=f"membership of group {group_id!r}")
            self.groups[group_id] = (classic.from_snapshot(group_id, payload)
                                     if classic.is_classic_payload(payload)
                                     else Group.from_payload(group_id, payload))
            return
        self._replay_offset(key, value, offset, into=None)

    def _replay_offset(self, key: bytes | None, value: bytes | None, offset: int, *,
                       into: dict[str, dict[TP, CommittedOffset]] | None) -> None:
        if key is None or not key.startswith(OFFSET_PREFIX):
            raise durable.CorruptValueError(f"__consumer_offsets record with unknown key {key!r}")
        group_id, topic, partition = _decode_offset_key(key)
        tp = (topic, partition)
        target = self.offsets if into is None else into
        if value is None:
            by_tp = target.get(group_id)
            if by_tp is not None:
                by_tp.pop(tp, None)
                if not by_tp:
                    del target[group_id]
            return
        payload = durable.decode(value, expected_version=RECORD_VERSION,
                                 what=f"offset of group {group_id!r} on {topic}-{partition}")
        target.setdefault(group_id, {})[tp] = CommittedOffset(
            int(payload["offset"]), str(payload.get("metadata", "")),
            int(payload["commit_ms"]), offset,
        )


def _decode_offset_key(key: bytes) -> tuple[str, str, int]:
    try:
        group_id, topic, partition = json.loads(key[len(OFFSET_PREFIX):])
    except (ValueError, TypeError) as exc:
        raise durable.CorruptValueError(f"unreadable offset key {key!r}") from exc
    return str(group_id), str(topic), int(partition)

