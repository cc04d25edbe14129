"""The first poll is prompt.

Goal: a new consumer's first poll(timeout) returns records already in the log
as soon as it has them, fetching the metadata it needs within the same call,
instead of returning only when the timeout is over (issue 17, item 4; the
first poll sent no Fetch, because the metadata it fetched arrived after it
had planned its fetches, and then slept for the rest of its timeout). This
holds after assign() + seek(), after seek_to_beginning() (a position reset
first), for several partitions at once, and for poll(timeout=0) called in a
loop, which must get started too.

Method: one LocalCluster per module with one topic of three partitions and
ten records in each; every test makes a new consumer (so it has no metadata
yet), records how long the first poll took, and asserts that it is well
below the timeout. These are behaviour checks with wide margins, not
benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from oncelog.testing import LocalCluster

TOPIC = "first-poll"
PARTITIONS = 3
RECORDS_PER_PARTITION = 10
POLL_TIMEOUT_S = 10.0
# Far above what a prompt poll takes (milliseconds), far below the timeout.
PROMPT_S = 5.0


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("first-poll") / "cluster",
                      group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        with Producer(bootstrap=cluster.bootstrap) as producer:
            for p in range(PARTITIONS):
                for i in range(RECORDS_PER_PARTITION):
                    producer.send(TOPIC, value=b"p%d-%d" % (p, i), partition=p)
            producer.flush()
        yield cluster.bootstrap


def first_poll(consumer: Consumer) -> tuple[float, list[ConsumerRecord]]:
    started = time.monotonic()
    records = consumer.poll(timeout=POLL_TIMEOUT_S)
    elapsed_s = time.monotonic() - started
    print(f"first poll({POLL_TIMEOUT_S}) returned {len(records)} records in {elapsed_s:.3f} s")
    return elapsed_s, records


def test_after_assign_and_seek(bootstrap: str) -> None:
    tp = TopicPartition(TOPIC, 1)
    with Consumer(bootstrap=bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 3)
        elapsed_s, records = first_poll(consumer)
    assert records, f"poll({POLL_TIMEOUT_S}) returned nothing after {elapsed_s:.2f} s"
    assert elapsed_s < PROMPT_S, f"the first poll took {elapsed_s:.2f} s"
    assert [(r.partition, r.offset, r.value) for r in records] == [
        (1, offset, b"p1-%d" % offset) for offset in range(3, RECORDS_PER_PARTITION)
    ]


def test_after_seek_to_beginning(bootstrap: str) -> None:
    tp = TopicPartition(TOPIC, 0)
    with Consumer(bootstrap=bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning([tp])  # the position is found by the poll
        elapsed_s, records = first_poll(consumer)
    assert records and records[0].offset == 0
    assert elapsed_s < PROMPT_S, f"the first poll took {elapsed_s:.2f} s"


def test_every_partition_at_once(bootstrap: str) -> None:
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap=bootstrap) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        elapsed_s, records = first_poll(consumer)
        got = list(records)
        # The rest of what is in the log comes just as promptly.
        started = time.monotonic()
        while len(got) < PARTITIONS * RECORDS_PER_PARTITION and time.monotonic() - started < 30:
            got.extend(consumer.poll(timeout=POLL_TIMEOUT_S))
        rest_s = time.monotonic() - started
    assert records and elapsed_s < PROMPT_S, f"the first poll took {elapsed_s:.2f} s"
    assert sorted((r.partition, r.offset) for r in got) == [
        (p, o) for p in range(PARTITIONS) for o in range(RECORDS_PER_PARTITION)
    ]
    assert rest_s < PROMPT_S, f"the remaining records took {rest_s:.2f} s"


def test_poll_zero_in_a_loop_gets_started(bootstrap: str) -> None:
    """poll(timeout=0) asks for metadata and positions too (within the short
    time it allows for them), so a loop of them gets the records."""
    tp = TopicPartition(TOPIC, 2)
    with Consumer(bootstrap=bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning([tp])
        started = time.monotonic()
        polls = 0
        records: list[ConsumerRecord] = []
        while not records and time.monotonic() - started < PROMPT_S:
            records = consumer.poll(timeout=0)
            polls += 1
        elapsed_s = time.monotonic() - started
    print(f"poll(0) returned records after {polls} polls, {elapsed_s:.3f} s")
    assert records, f"{polls} polls of poll(timeout=0) returned nothing in {elapsed_s:.2f} s"
    assert records[0].offset == 0
