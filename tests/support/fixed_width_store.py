"""Stores written in the first (fixed-width) record format, for the tests of
the rewrite to Kafka's format (services/partition_store/format_upgrade.py).

The batches come from tests/fixtures/fixed_width_batches.json: bytes written
by the fixed-width encoder itself, with the inputs each was made from. A
store is laid out through the storage layer as a store of that time laid it
out: the catalog record, the batches under their base offsets (stamped:
the CRC does not cover base offset and leader epoch), the partition meta,
the time index, and, for a compacted topic, its compaction state. No `F`
key: that is what marks a store of the old format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from oncelog.records import Header, read_header, stamp_batch
from services.partition_store.core.codec import encode_offset, encode_partition_meta
from services.partition_store.core.compaction import CompactionState, encode_compaction_state
from services.partition_store.core.topics import TopicRecord, encode_topic_record
from services.partition_store.storage import keys
from services.partition_store.storage.port import KeyValueStore, WriteGroup

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fixed_width_batches.json"


@dataclass(frozen=True, slots=True)
class ExpectedRecord:
    """A record as the fixture's encoder was given it, at its offset in the
    case's batch as written (before the test places the batch)."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    batch: bytes
    records: tuple[ExpectedRecord, ...]
    # (marker type, coordinator epoch) of a control batch.
    control: tuple[int, int] | None


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


def load_cases() -> dict[str, Case]:
    doc = json.loads(FIXTURE.read_text())
    cases = {}
    for case in doc["cases"]:
        records = tuple(
            ExpectedRecord(
                r["offset"], r["timestamp_ms"], _bytes(r["key"]), _bytes(r["value"]),
                tuple((k, _bytes(v)) for k, v in r["headers"] or ()),
            )
            for r in case["records"]
        )
        control = (case["control"][0], case["control"][1]) if case["control"] else None
        cases[case["name"]] = Case(case["name"], bytes.fromhex(case["batch"]), records, control)
    return cases


@dataclass(frozen=True, slots=True)
class Placed:
    """A fixture batch as stored: its base offset and the records it holds
    there (offsets moved with the batch)."""

    case: Case
    base_offset: int
    stored: bytes

    @property
    def records(self) -> list[ExpectedRecord]:
        shift = self.base_offset - read_header(self.case.batch).base_offset
        return [ExpectedRecord(r.offset + shift, r.timestamp_ms, r.key, r.value, r.headers)
                for r in self.case.records]


def write_topic(store: KeyValueStore, record: TopicRecord) -> None:
    group = WriteGroup()
    group.put(keys.catalog_key(record.name), encode_topic_record(record))
    store.write(group)


def write_partition(
    store: KeyValueStore, topic_id: int, partition: int, cases: Iterable[Case], *,
    leader_epoch: int = 0, clean_offset: int | None = None,
) -> list[Placed]:
    """Lays the cases' batches out one after the other from offset 0, with
    the partition meta and time index a store wrote with them; with
    `clean_offset`, a compaction state whose clean bytes are the stored
    size of the batches below it. One WriteGroup per batch, as appends were."""
    placed: list[Placed] = []
    offset = 0
    size = 0
    clean_bytes = 0
    max_ts: int | None = None
    for case in cases:
        header = read_header(case.batch)
        stored = stamp_batch(case.batch, base_offset=offset, leader_epoch=leader_epoch)
        group = WriteGroup()
        group.put(keys.log_key(topic_id, partition, offset), stored)
        size += len(stored)
        if clean_offset is not None and offset < clean_offset:
            clean_bytes += len(stored)
        group.put(keys.meta_key(topic_id, partition), encode_partition_meta(0, size))
        if max_ts is None or header.max_timestamp_ms > max_ts:
            max_ts = header.max_timestamp_ms
            group.put(keys.time_index_key(topic_id, partition, max_ts), encode_offset(offset))
        store.write(group)
        placed.append(Placed(case, offset, stored))
        offset += header.last_offset_delta + 1
    if clean_offset is not None:
        group = WriteGroup()
        group.put(keys.compaction_key(topic_id, partition), encode_compaction_state(
            CompactionState(clean_offset=clean_offset, clean_bytes=clean_bytes)))
        store.write(group)
    return placed


def expected_records(placed: Sequence[Placed], *, aborted_producers: Iterable[int] = (),
                     ) -> list[ExpectedRecord]:
    """Every data record of the placed batches in offset order, without
    those of transactional batches of `aborted_producers`."""
    aborted = set(aborted_producers)
    out = []
    for p in placed:
        header = read_header(p.stored)
        if header.is_control or (header.is_transactional and header.producer_id in aborted):
            continue
        out.extend(p.records)
    return out
