"""Consumer.poll_columns hands out what poll() would, as columns.

Goal: poll_columns() is poll() for callers that move records by the batch
(a copier into Producer.send_many): the same records, in offset order per
partition, no more than max_poll_records in all, each partition's position
moved exactly past what it handed out, so that poll() and poll_columns()
can take turns and commit what they read; under read_committed an aborted
transaction's records are not among them; with a deserializer it refuses,
naming poll().

Method: one LocalCluster per module and a topic of two partitions holding
keyed and unkeyed records, headers, and an aborted transaction between
committed ones. A reference consumer reads it all with poll(); the others
read it with poll_columns() (alone, and alternating with poll()), and what
they got is compared record by record with the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from oncelog import (
    Admin,
    Consumer,
    ConsumerRecord,
    PartitionRecords,
    Producer,
    TopicPartition,
    errors,
)
from oncelog.testing import LocalCluster

TOPIC = "columns"
PARTITIONS = 2
# Per partition: plain records, then three transactions of this many each
# (committed, aborted, committed).
PLAIN_RECORDS = 60
TXN_RECORDS = 20
TPS = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
# Failure guard, not an expectation.
POLLS = 200

Row = tuple[int, int, Any, Any, tuple[tuple[str, bytes | None], ...], int]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("columns") / "cluster",
                      group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        with Producer(bootstrap=cluster.bootstrap, linger_ms=5) as producer:
            for i in range(PLAIN_RECORDS):
                for p in range(PARTITIONS):
                    producer.send(TOPIC, key=None if i % 3 else b"k%d" % i,
                                  value=b"p%d-%d" % (p, i), partition=p,
                                  headers=[("n", b"%d" % i)] if i % 5 == 0 else None)
            producer.flush()
        with Producer(bootstrap=cluster.bootstrap, transactional_id="columns") as producer:
            producer.init_transactions()
            for outcome in ("commit", "abort", "commit"):
                producer.begin_transaction()
                for i in range(TXN_RECORDS):
                    for p in range(PARTITIONS):
                        producer.send(TOPIC, value=b"%s-p%d-%d" % (outcome.encode(), p, i),
                                      partition=p)
                if outcome == "commit":
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
        yield cluster.bootstrap


def _consumer(bootstrap: str, **options: Any) -> Consumer:
    consumer = Consumer(bootstrap=bootstrap, isolation_level="read_committed", **options)
    consumer.assign(TPS)
    consumer.seek_to_beginning(TPS)
    return consumer


def _rows_of_records(records: list[ConsumerRecord]) -> list[Row]:
    return [(r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms)
            for r in records]


def _rows_of_columns(parts: list[PartitionRecords]) -> list[Row]:
    rows: list[Row] = []
    for part in parts:
        assert part.topic_partition == TopicPartition(TOPIC, part.partition)
        assert len(part) == len(part.keys) == len(part.values) == len(part.headers) == \
            len(part.timestamps_ms) > 0
        assert part.offsets == sorted(part.offsets)
        rows.extend(zip([part.partition] * len(part), part.offsets, part.keys, part.values,
                        part.headers, part.timestamps_ms, strict=True))
    return rows


def _read_all(consumer: Consumer, take: Any) -> list[Row]:
    """Every committed record of the topic, through `take(consumer)`."""
    rows: list[Row] = []
    for _ in range(POLLS):
        if all(consumer.position(tp) >= end
               for tp, end in consumer.end_offsets(TPS).items()) and rows:
            break
        rows.extend(take(consumer))
    return rows


@pytest.fixture(scope="module")
def reference(bootstrap: str) -> list[Row]:
    with _consumer(bootstrap) as consumer:
        rows = _read_all(consumer, lambda c: _rows_of_records(c.poll(timeout=1)))
    # The committed records only: plain ones and two transactions' worth.
    assert len(rows) == PARTITIONS * (PLAIN_RECORDS + 2 * TXN_RECORDS)
    assert not [r for r in rows if r[3].startswith(b"abort-")]
    return rows


def _by_partition(rows: list[Row]) -> dict[int, list[Row]]:
    out: dict[int, list[Row]] = {p: [] for p in range(PARTITIONS)}
    for row in rows:
        out[row[0]].append(row)
    return out


def test_the_columns_hold_what_poll_hands_out(bootstrap: str, reference: list[Row]) -> None:
    limit = 7
    with _consumer(bootstrap, max_poll_records=limit) as consumer:
        sizes: list[int] = []

        def take(c: Consumer) -> list[Row]:
            parts = c.poll_columns(timeout=1)
            sizes.append(sum(len(p) for p in parts))
            return _rows_of_columns(parts)

        rows = _read_all(consumer, take)
        assert max(sizes) == limit, "max_poll_records bounds each poll_columns() in all"
        assert {tp: consumer.position(tp) for tp in TPS} == consumer.end_offsets(TPS)
    assert _by_partition(rows) == _by_partition(reference)


def test_poll_and_poll_columns_take_turns_without_a_gap_or_a_repeat(
        bootstrap: str, reference: list[Row]) -> None:
    turn = iter(range(10**6))
    with _consumer(bootstrap, max_poll_records=11) as consumer:
        rows = _read_all(consumer, lambda c: _rows_of_columns(c.poll_columns(timeout=1))
                         if next(turn) % 2 else _rows_of_records(c.poll(timeout=1)))
    assert _by_partition(rows) == _by_partition(reference)


def test_a_consumer_with_a_deserializer_is_told_to_use_poll(bootstrap: str) -> None:
    with _consumer(bootstrap, value_deserializer=lambda v: v) as consumer, \
            pytest.raises(errors.IllegalStateError, match=r"use poll\(\)"):
        consumer.poll_columns(timeout=1)
