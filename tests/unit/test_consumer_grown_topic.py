"""A group consumer whose subscribed topic grows (CreatePartitions).

Goal: the group coordinator hands the topic's new partitions to the member,
and poll() takes them on — also while the metadata this consumer reads has
not caught up with the coordinator's (a store that learns the new count a
moment later than the one the coordinator asked): the new partitions then
wait, poll() neither raises nor returns records of theirs, and once the
metadata shows them they are read from the start (auto_offset_reset
earliest). The existing partitions are read all along.

Method: tests/support/inprocess_cluster.InProcessCluster (the real store
and coordinators in this process, heartbeats every 20 ms); the topic grows
through Admin.create_partitions. The lagging store is the consumer's own
metadata lookups cut back to the old partition count (its ClusterClient's
one Metadata call, wrapped) until the test lets them through. Waits poll
with generous bounds as failure guards only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from oncelog import Admin, Consumer, ConsumerRecord, TopicPartition
from oncelog import records as codec
from oncelog._client import ClusterMetadata
from tests.support.inprocess_cluster import InProcessCluster

BEFORE, AFTER = 2, 4
MAX_POLLS = 2000


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster(min_session_timeout_ms=100, max_heartbeat_interval_ms=20,
                          session_check_interval_ms=20) as s:
        s.create_topic("t", BEFORE)
        yield s


def fill(store: InProcessCluster, partition: int) -> None:
    store.append_raw("t", partition, codec.encode_batch(
        [(None, f"p{partition}".encode(), None, 100)]))


class LaggingMetadata:
    """Cuts topic "t" back to its old partition count in every Metadata
    answer the consumer takes, while `lagging` is set."""

    def __init__(self, consumer: Consumer) -> None:
        self.lagging = True
        client = consumer._client
        real = client._fetch_metadata_once

        def fetch(deadline_s: float | None) -> ClusterMetadata:
            md = real(deadline_s)
            info = md.topics.get("t")
            if not self.lagging or info is None or info.num_partitions <= BEFORE:
                return md
            cut = dataclasses.replace(
                info, leaders=info.leaders[:BEFORE], leader_epochs=info.leader_epochs[:BEFORE],
                replicas=info.replicas[:BEFORE], isr=info.isr[:BEFORE],
                targets=info.targets[:BEFORE])
            return dataclasses.replace(md, topics={**md.topics, "t": cut})

        client._fetch_metadata_once = fetch  # type: ignore[method-assign]


def test_new_partitions_are_assigned_and_wait_for_the_metadata(
        store: InProcessCluster) -> None:
    for p in range(BEFORE):
        fill(store, p)
    consumer = Consumer(bootstrap=store.address, group_id="g", fetch_max_wait_ms=20,
                        auto_offset_reset="earliest")
    try:
        consumer.subscribe(["t"])
        got: list[ConsumerRecord] = []
        for _ in range(MAX_POLLS):
            got += consumer.poll(timeout=0.01)
            if len(got) == BEFORE:
                break
        assert sorted(r.value for r in got) == [b"p0", b"p1"]
        lag = LaggingMetadata(consumer)
        with Admin(bootstrap=store.address) as admin:
            admin.create_partitions({"t": AFTER})
        for p in range(AFTER):
            fill(store, p)
        # The coordinator assigns the new partitions; the consumer's
        # metadata does not show them: poll() goes on with the old ones.
        after: list[ConsumerRecord] = []
        for _ in range(MAX_POLLS):
            after += consumer.poll(timeout=0.01)
            if len(consumer.assignment()) == AFTER and len(after) == BEFORE:
                break
        assert consumer.assignment() == {TopicPartition("t", p) for p in range(AFTER)}
        for _ in range(20):
            after += consumer.poll(timeout=0.01)
        assert sorted(r.value for r in after) == [b"p0", b"p1"]
        # The metadata catches up: the new partitions are read from their start.
        lag.lagging = False
        for _ in range(MAX_POLLS):
            after += consumer.poll(timeout=0.01)
            if len(after) == AFTER:
                break
        assert sorted((r.partition, r.offset, r.value) for r in after) == [
            (0, 1, b"p0"), (1, 1, b"p1"), (2, 0, b"p2"), (3, 0, b"p3")]
    finally:
        consumer.close()
