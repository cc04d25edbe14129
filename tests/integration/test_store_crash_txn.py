"""`kill -9` of the partition store during a transaction and during marker writing.

Method: a LocalCluster with one store (which also holds the transaction log).
(1) The store is SIGKILLed while a transaction is open, after some of its
records were acknowledged, and restarted; the producer writes more and commits.
(2) The store is started with a named crash point in its marker path — before
the marker is written, or after it is durable but before the coordinator hears
so — and SIGKILLs itself when the coordinator's markers arrive; it is
restarted without it. In every case the transaction ends as decided: all of a
committed transaction visible under read_committed, none of an aborted one,
and the producer goes on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from tests.support.reading import read_all
from tests.support.txn import EndInBackground, wait_txn_state

TOPIC = "txn"
PARTITIONS = 3


def _values(bootstrap: str) -> list[bytes]:
    got = read_all(bootstrap, TOPIC, PARTITIONS, isolation_level="read_committed")
    return sorted(r.value for r in got if r.value is not None)


def test_store_killed_while_a_transaction_is_open(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        with Producer(bootstrap=cluster.bootstrap, transactional_id="open-txn") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(300):
                producer.send(TOPIC, value=b"before-%d" % i, partition=i % PARTITIONS)
            producer.flush()
            cluster.kill("partition_store", 0)
            cluster.restart("partition_store", 0)
            # Nothing of the open transaction is visible after recovery.
            assert _values(cluster.bootstrap) == []
            for i in range(300):
                producer.send(TOPIC, value=b"after-%d" % i, partition=i % PARTITIONS)
            producer.commit_transaction()
        expected = sorted([b"before-%d" % i for i in range(300)] +
                          [b"after-%d" % i for i in range(300)])
        assert _values(cluster.bootstrap) == expected


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("crash_point", ["store.before_marker_write",
                                         "store.after_marker_durable"])
def test_store_killed_while_writing_markers(tmp_path: Path, crash_point: str,
                                            commit: bool) -> None:
    tid = f"markers-{crash_point}-{commit}"
    with LocalCluster(tmp_path, group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        cluster.restart("partition_store", 0, env={"ONCELOG_TEST_CRASH_POINTS": crash_point})
        with Producer(bootstrap=cluster.bootstrap, transactional_id=tid) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(300):
                producer.send(TOPIC, value=b"first-%d" % i, partition=i % PARTITIONS)
            producer.flush()
            ender = EndInBackground(producer, commit=commit)
            assert cluster.wait_exit("partition_store", 0) != 0, "the crash point did not fire"
            cluster.restart("partition_store", 0, env={"ONCELOG_TEST_CRASH_POINTS": ""})
            ender.join()
            with Admin(bootstrap=cluster.bootstrap) as admin:
                wait_txn_state(admin, tid, "CompleteCommit" if commit else "CompleteAbort")
            expected = sorted(b"first-%d" % i for i in range(300)) if commit else []
            assert _values(cluster.bootstrap) == expected
            producer.begin_transaction()
            producer.send(TOPIC, value=b"second", partition=0)
            producer.commit_transaction()
        assert b"second" in _values(cluster.bootstrap)
