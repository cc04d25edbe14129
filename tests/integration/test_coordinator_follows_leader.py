"""Coordinators in every store follow their state partitions' leaders.

Goal: on a replicated cluster whose stores all run both coordinators
(LocalCluster(coordinators_in_stores=True) with etcd), the coordinator of
a transactional id (or a group) is the one in the store that leads its
`__transaction_state` (`__consumer_offsets`) partition, as in Kafka. When
that store dies and stays down, the partition's new leader takes the
coordinator's work over by itself: the open transaction is ended, a new
one commits, committed offsets are still there, and nothing committed is
lost or doubled. Before, the coordinator stayed with its store, so
transactions and groups waited for that store to come back.

Method: LocalCluster with 3 stores, one etcd member and a 2 s lease; a
transaction commits, a second one is left open and the group commits
offsets; the store that runs both coordinators is killed with kill -9 and
not restarted; a successor producer with the same transactional id and a
consumer of the same group then work against the store that leads the
state partitions now, which store_running names (from Metadata), and
listing the transactions (which asks every coordinator Metadata names)
does not wait for the dead store. No assertion depends on timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster
from oncelog.wire.placement import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from tests.support.reading import poll_records, read_all

PARTITIONS = 2
RECORDS = 20
DEADLINE_S = 60.0
STATE_PARTITIONS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", partition_stores=3, etcd_members=1,
                      coordinators_in_stores=True,
                      transaction_state_partitions=STATE_PARTITIONS,
                      consumer_offsets_partitions=STATE_PARTITIONS,
                      env={"ONCELOG_LEASE_TTL_S": "2"}) as c:
        c.wait_in_sync([TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC])
        yield c


def committed_values(cluster: LocalCluster, topic: str) -> list[bytes]:
    return sorted(r.value or b"" for r in read_all(
        cluster.bootstrap_servers, topic, PARTITIONS, isolation_level="read_committed"))


def led_elsewhere(cluster: LocalCluster, kind: str, key: str, dead: int) -> int:
    """The store that runs the key's coordinator, once it is no longer the
    dead one."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            store = cluster.store_running(kind, key)
            if store != dead:
                return store
        except ValueError:
            pass  # no leader at this moment
        assert time.monotonic() < deadline, f"the {kind} of {key!r} did not move"
        time.sleep(0.2)


def test_the_coordinators_move_with_their_partitions_leadership_when_a_store_dies(
        cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap_servers
    txn_id = "mover"
    host = cluster.store_running("coordinator", txn_id)
    # A group whose coordinator is in the same store, so one kill takes
    # both (where each partition is led depends on the start-up).
    group = next(g for g in (f"movers-{i}" for i in range(100))
                 if cluster.store_running("group_coordinator", g) == host)
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=3)
    cluster.wait_in_sync([topic_name])
    with Producer(bootstrap=bootstrap) as producer:
        for i in range(RECORDS):
            producer.send(topic_name, value=b"in-%d" % i, partition=i % PARTITIONS)
    tps = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]

    first = Producer(bootstrap=bootstrap, transactional_id=txn_id)
    consumer = Consumer(bootstrap=bootstrap, group_id=group, auto_offset_reset="earliest")
    try:
        consumer.subscribe([topic_name])
        poll_records(consumer, RECORDS, deadline_s=DEADLINE_S)
        first.init_transactions()
        first.begin_transaction()
        first.send(topic_name, value=b"committed", partition=0)
        done = {tp: consumer.position(tp) for tp in tps}
        first.send_offsets_to_transaction(done, consumer.group_metadata())
        first.commit_transaction()
        # Left open when the store that runs both coordinators dies.
        first.begin_transaction()
        for p in range(PARTITIONS):
            first.send(topic_name, value=b"open-%d" % p, partition=p).result(timeout=60)
        cluster.kill("partition_store", host)
    finally:
        consumer.close(timeout=1)
        first.close(timeout=1)

    # Not restarted: the state partitions' new leader runs their coordinators.
    now = led_elsewhere(cluster, "coordinator", txn_id, host)
    assert led_elsewhere(cluster, "group_coordinator", group, host) == now
    with Producer(bootstrap=bootstrap, transactional_id=txn_id) as successor:
        # Ends the open transaction (aborted: never decided) first.
        successor.init_transactions()
        successor.begin_transaction()
        successor.send(topic_name, value=b"successor", partition=1)
        successor.commit_transaction()
    with Consumer(bootstrap=bootstrap, group_id=group) as checker:
        assert checker.committed(tps, timeout=60) == done
    assert cluster.store_running("coordinator", txn_id) == now
    # Metadata names only the coordinators of live stores, so what asks them
    # all (listing transactions; read_all waits for markers that way) does
    # not wait for the dead one.
    with Admin(bootstrap=bootstrap) as admin:
        listed = {t.transactional_id: t.state for t in admin.list_transactions()}
    assert listed[txn_id] in ("CompleteCommit", "Empty"), listed
    assert committed_values(cluster, topic_name) == sorted(
        [b"committed", b"successor", *(b"in-%d" % i for i in range(RECORDS))])
    with Consumer(bootstrap=bootstrap, isolation_level="read_committed") as reader:
        stable = reader.end_offsets(tps)
    with Consumer(bootstrap=bootstrap) as reader:
        # Nothing holds the last stable offset back: it is the log's end.
        assert reader.end_offsets(tps) == stable
