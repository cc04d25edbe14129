"""`kill -9` of the transaction coordinator at each step of the two-phase commit.

Method: a LocalCluster with two partition stores (so markers go out in two
RPCs) and a topic whose partitions live on both. The coordinator is started
with one named crash point armed (ONCELOG_TEST_CRASH_POINTS), which SIGKILLs
it at that exact step: after PrepareCommit/PrepareAbort is durable but before
any marker; after the markers reached one store but not the other; after all
markers but before Complete*. The test restarts it without the crash point.
Then: the transaction ends as decided (read_committed shows all of a committed
transaction and none of an aborted one, on every partition), the coordinator
reports Complete*, and the producer goes on with a new transaction.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog import Admin, Producer, TopicPartition
from oncelog.testing import LocalCluster
from tests.support.reading import read_all
from tests.support.txn import EndInBackground, wait_txn_state

TOPIC = "txn"
PARTITIONS = 4
CRASH_POINTS = [
    "coordinator.after_prepare",
    "coordinator.after_some_markers",
    "coordinator.before_complete",
]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("crash_point", CRASH_POINTS)
def test_coordinator_crash_during_two_phase_commit(tmp_path: Path, crash_point: str,
                                                   commit: bool) -> None:
    with LocalCluster(tmp_path, partition_stores=2, group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
            leaders = {p.leader_node_id for p in admin.describe_topic(TOPIC).partitions}
        assert leaders == {0, 1}, "the topic must span both stores"
        # Arm the crash point for the next start of the coordinator only.
        cluster.restart("coordinator", 0, env={"ONCELOG_TEST_CRASH_POINTS": crash_point})
        tid = f"crash-{crash_point}-{commit}"
        producer = Producer(bootstrap=cluster.bootstrap, transactional_id=tid)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(200):
                producer.send(TOPIC, value=b"first-%d" % i, partition=i % PARTITIONS)
            producer.flush()
            ender = EndInBackground(producer, commit=commit)
            assert cluster.wait_exit("coordinator", 0) != 0, "the crash point did not fire"
            cluster.restart("coordinator", 0, env={"ONCELOG_TEST_CRASH_POINTS": ""})
            ender.join()
            with Admin(bootstrap=cluster.bootstrap) as admin:
                wait_txn_state(admin, tid, "CompleteCommit" if commit else "CompleteAbort")

            committed = read_all(cluster.bootstrap, TOPIC, PARTITIONS,
                                 isolation_level="read_committed")
            values = sorted(r.value for r in committed if r.value is not None)
            expected = sorted(b"first-%d" % i for i in range(200)) if commit else []
            assert values == expected

            # The producer goes on: a second transaction commits normally.
            producer.begin_transaction()
            for i in range(20):
                producer.send(TOPIC, value=b"second-%d" % i, partition=i % PARTITIONS)
            producer.commit_transaction()
        finally:
            producer.close()
        committed = read_all(cluster.bootstrap, TOPIC, PARTITIONS, isolation_level="read_committed")
        seconds = sorted(r.value for r in committed if r.value and r.value.startswith(b"second"))
        assert seconds == sorted(b"second-%d" % i for i in range(20))
        # Markers reached both stores' partitions: nothing is left open anywhere.
        with Admin(bootstrap=cluster.bootstrap) as admin:
            for p in range(PARTITIONS):
                open_txns = [d for d in admin.describe_producers(TopicPartition(TOPIC, p))
                             if d.current_txn_start_offset not in (None, -1)]
                assert open_txns == [], f"partition {p} still has open transactions"
