"""Compaction with real processes: `kill -9` of the partition store in the
middle of and right after a compaction pass, and the transaction
coordinator reloading from a compacted `__transaction_state`.

Goal: whatever instant the store dies, it restarts with a log where every
key's newest value is at its original offset, and the log ends up exactly
as an uninterrupted pass leaves it; the producer goes on at its next
sequence. A coordinator restarted (kill -9) after its transaction log was
compacted knows each transactional id's state, producer id and epoch, and
the producer goes on committing — also after the store itself restarted
from the compacted log — and is fenced by a new instance as usual.

Method: LocalCluster. The store runs with small compaction chunks; the
crash test writes first with compaction off (ONCELOG_COMPACTION_INTERVAL_MS
far out), then restarts the store with a short interval and one armed crash
point (services/common/kernel/crashpoints.py: SIGKILL at that step), waits for it to
die, and restarts it without. What survives is compared with an oracle
computed from what was acknowledged. Waits poll a condition (a read, a
metric) under a generous deadline that only turns a hang into a failure.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oncelog import Admin, Producer, errors
from oncelog.testing import LocalCluster
from services.common.metadata.cluster import TRANSACTION_STATE_TOPIC
from tests.support.reading import read_all

TOPIC = "compacted"
DEADLINE_S = 60.0
FAR_OUT_MS = str(3_600_000)

Rec = tuple[int, bytes | None, bytes | None]


def metric(cluster: LocalCluster, name: str, topic: str) -> float:
    """A store counter's value for one topic (0 when it has none yet)."""
    with urllib.request.urlopen(cluster.metrics_url("partition_store"), timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("topic") == topic:
                return float(sample.value)
    return 0.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    give_up_at = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > give_up_at:
            raise AssertionError(f"{what} did not happen within {DEADLINE_S} s")
        time.sleep(0.1)


def read_log(cluster: LocalCluster) -> list[Rec]:
    return [(r.offset, r.key, r.value) for r in read_all(cluster.bootstrap, TOPIC, 1)]


def survivors(written: list[Rec], end: int) -> list[Rec]:
    """What a whole pass over [0, end) leaves: each key's newest record below
    `end` (no tombstones here), and everything from `end` on."""
    newest: dict[bytes | None, int] = {}
    for offset, key, _value in written:
        if offset < end:
            newest[key] = offset
    return [r for r in written if r[0] >= end or newest[r[1]] == r[0]]


@pytest.mark.parametrize(
    "crash_point", ["store.compaction_after_first_chunk", "store.compaction_after_pass"],
)
def test_store_killed_during_and_after_compaction(tmp_path: Path, crash_point: str) -> None:
    with LocalCluster(
        tmp_path, group_coordinators=0,
        extra_args={"partition_store": ["--compaction-chunk-bytes", "512"]},
        env={"ONCELOG_COMPACTION_INTERVAL_MS": FAR_OUT_MS},
    ) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1, config={"cleanup.policy": "compact"})
        with Producer(bootstrap=cluster.bootstrap) as producer:
            written: list[Rec] = []
            for i in range(300):
                key, value = b"k%d" % (i % 12), b"v%d" % i
                meta = producer.send(TOPIC, key=key, value=value, partition=0).result()
                written.append((meta.offset, key, value))
            assert read_log(cluster) == written
            # The newest batch is never compacted: the pass ends below it.
            end = written[-1][0]
            expected = survivors(written, end)

            cluster.restart("partition_store", 0, wait=False, env={
                "ONCELOG_COMPACTION_INTERVAL_MS": "100", "ONCELOG_TEST_CRASH_POINTS": crash_point,
            })
            assert cluster.wait_exit("partition_store", 0) != 0, "the crash point did not fire"
            cluster.restart("partition_store", 0, env={
                "ONCELOG_COMPACTION_INTERVAL_MS": "100", "ONCELOG_TEST_CRASH_POINTS": "",
            })
            # Right after the restart (pass finished or not): nothing lost,
            # nothing moved, every key's newest value where it was written.
            now = read_log(cluster)
            assert set(now) <= set(written)
            assert now == sorted(now)
            assert {k: (o, v) for o, k, v in now} == {k: (o, v) for o, k, v in written}
            # Then the log is exactly what one uninterrupted pass leaves.
            wait_for(lambda: read_log(cluster) == expected, "the compacted log")
            if crash_point == "store.compaction_after_first_chunk":
                assert metric(cluster, "oncelog_store_compactions_total", TOPIC) >= 1
            # Producer state survived both: the producer goes on at its next
            # sequence (a lost state would answer OUT_OF_ORDER_SEQUENCE_NUMBER).
            meta = producer.send(TOPIC, key=b"k0", value=b"after", partition=0).result()
            assert meta.offset == end + 1
        assert read_log(cluster) == [*expected, (end + 1, b"k0", b"after")]


def test_coordinator_reloads_from_a_compacted_transaction_log(tmp_path: Path) -> None:
    tid = "compacted-tid"
    with LocalCluster(
        tmp_path, group_coordinators=0, transaction_state_partitions=1,
        extra_args={"partition_store": ["--compaction-interval-ms", "100"]},
    ) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("out", partitions=1)
        producer = Producer(bootstrap=cluster.bootstrap, transactional_id=tid)
        try:
            producer.init_transactions()
            for i in range(12):
                producer.begin_transaction()
                producer.send("out", value=b"txn-%d" % i)
                producer.commit_transaction()
            with Admin(bootstrap=cluster.bootstrap) as admin:
                # commit_transaction returns once the commit is decided
                # (PrepareCommit durable, as Kafka's EndTxn); CompleteCommit
                # follows once the markers are written.
                wait_for(lambda: admin.describe_transaction(tid).state == "CompleteCommit",
                         "the last commit complete")
                before = admin.describe_transaction(tid)
            # Each transaction wrote several records of this id; compaction
            # removes all but the newest.
            wait_for(lambda: metric(cluster, "oncelog_store_compaction_removed_bytes_total",
                                    TRANSACTION_STATE_TOPIC) > 0,
                     "compaction of __transaction_state")

            cluster.kill("coordinator", 0)
            cluster.restart("coordinator", 0)
            with Admin(bootstrap=cluster.bootstrap) as admin:
                after = admin.describe_transaction(tid)
            assert (after.state, after.producer_id, after.producer_epoch) == (
                before.state, before.producer_id, before.producer_epoch)
            # The producer is still the current instance: it commits on.
            producer.begin_transaction()
            producer.send("out", value=b"txn-12")
            producer.commit_transaction()

            # The store restarts from the compacted log; the coordinator
            # reloads from it once more.
            cluster.kill("partition_store", 0)
            cluster.restart("partition_store", 0)
            cluster.kill("coordinator", 0)
            cluster.restart("coordinator", 0)
            with Admin(bootstrap=cluster.bootstrap) as admin:
                reloaded = admin.describe_transaction(tid)
            assert (reloaded.state, reloaded.producer_id, reloaded.producer_epoch) == (
                "CompleteCommit", before.producer_id, before.producer_epoch + 1)
            # A new instance fences the old one, from the reloaded epoch.
            with Producer(bootstrap=cluster.bootstrap, transactional_id=tid) as successor:
                successor.init_transactions()
                with Admin(bootstrap=cluster.bootstrap) as admin:
                    fenced = admin.describe_transaction(tid)
                assert fenced.producer_id == before.producer_id
                assert fenced.producer_epoch > reloaded.producer_epoch
                with pytest.raises(errors.ProducerFencedError):
                    producer.begin_transaction()
                    producer.send("out", value=b"zombie").result()
                    producer.commit_transaction()
        finally:
            producer.close()
        committed = read_all(cluster.bootstrap, "out", 1, isolation_level="read_committed")
        assert sorted(r.value or b"" for r in committed) == sorted(
            b"txn-%d" % i for i in range(13))
