"""Two-phase-commit participation (KIP-939) with real processes.

Goal: what the Spark streaming sink relies on. A transaction prepared by one
process (a task's producer, in a process of its own) survives that process's
`kill -9` and a `kill -9` and restart of the coordinator; close() leaves it
prepared; the coordinator's timeout never aborts it (nor an unprepared
transaction of a two-phase-commit producer) while it does abort a plain
transaction with the same timeout;
another process (the driver) keeps it with init_transactions(keep_prepared_
txn=True) and commits it with the prepared state, or aborts it by completing
with a state that does not match; completing the same state again, from the
same or a third process, answers the same and changes nothing;
read_committed readers see exactly the committed records, once; the admin
tools describe the prepared transaction, do not report it as hanging, and
can abort it.

Method: one LocalCluster for the module (one store, one coordinator whose
timer runs every 100 ms). Task producers run as `python -m
tests.support.two_phase_task`, which prepares and prints its prepared state,
then waits to be SIGKILLed. The driver is a Producer in the test process.
The timeout check is not timed: a plain transaction started after the
two-phase ones, with the same 1 s timeout, must be aborted by the
coordinator first (waited for with a generous bound), which shows the timer
has passed the two-phase transactions' deadlines too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from oncelog import Admin, PreparedTxnState, Producer
from oncelog.testing import LocalCluster
from tests.support.reading import read_all
from tests.support.txn import wait_txn_state

TOPIC = "sink"
PARTITIONS = 2
RECORDS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("two-phase"), partition_stores=1, coordinators=1,
        group_coordinators=0,
        extra_args={"coordinator": ["--transaction-check-interval-ms", "100"]},
    ) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        yield cluster


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        yield admin


def prepare_in_a_process_then_kill_it(cluster: LocalCluster, transactional_id: str
                                      ) -> PreparedTxnState:
    """A task: writes RECORDS records, prepares, hands over its prepared
    state, and dies (SIGKILL) with the transaction prepared."""
    task = subprocess.Popen(
        [sys.executable, "-m", "oncelog_local.child", str(os.getpid()), sys.executable, "-m",
         "tests.support.two_phase_task", cluster.bootstrap, transactional_id, TOPIC,
         str(PARTITIONS), str(RECORDS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert task.stdout is not None
        line = task.stdout.readline()
        assert line.startswith("PREPARED "), (line, task.stderr.read() if task.stderr else "")
        return PreparedTxnState.parse(line.split()[1])
    finally:
        task.send_signal(signal.SIGKILL)
        task.wait()


def values(bootstrap: str, transactional_id: str) -> list[bytes]:
    """The transactional id's records a read_committed reader sees."""
    prefix = f"{transactional_id}-".encode()
    return sorted(r.value or b"" for r in read_all(bootstrap, TOPIC, PARTITIONS,
                                                   isolation_level="read_committed")
                  if (r.value or b"").startswith(prefix))


def expected(transactional_id: str) -> list[bytes]:
    return sorted(f"{transactional_id}-{i}".encode() for i in range(RECORDS))


def driver(cluster: LocalCluster, transactional_id: str) -> Producer:
    return Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id,
                    transaction_two_phase_commit_enable=True)


def test_prepared_survives_producer_and_coordinator_kill_and_another_process_commits(
        cluster: LocalCluster, admin: Admin) -> None:
    tid = "sink-task-0"
    state = prepare_in_a_process_then_kill_it(cluster, tid)
    for restart in (False, True):
        if restart:
            cluster.kill("coordinator", 0)
            cluster.restart("coordinator", 0)
        described = admin.describe_transaction(tid)
        assert (described.state, described.two_phase_commit) == ("Prepared", True)
        assert described.prepared_transaction == state
        assert len(described.partitions) == PARTITIONS
        # Held open, invisible to read_committed, and not hanging: its
        # coordinator holds it, however old it gets.
        assert values(cluster.bootstrap, tid) == []
        assert admin.find_hanging_transactions(max_transaction_timeout_ms=1) == []

    with driver(cluster, tid) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.transaction_state == "prepared_transaction"
        assert producer.prepared_transaction_state == state
        assert producer.complete_transaction(state) is True
        assert producer.transaction_state == "ready"
        wait_txn_state(admin, tid, "CompleteCommit")
        assert values(cluster.bootstrap, tid) == expected(tid)
        # The same completion again: the same answer, nothing written.
        assert producer.complete_transaction(state) is True
    # ... and from a third process that finds nothing prepared.
    with driver(cluster, tid) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.transaction_state == "ready"
        assert producer.complete_transaction(state) is True
    assert values(cluster.bootstrap, tid) == expected(tid)
    assert admin.find_hanging_transactions() == []


def test_timeout_spares_two_phase_transactions_and_a_mismatch_aborts(
        cluster: LocalCluster, admin: Admin) -> None:
    prepared_tid, ongoing_tid, plain_tid = "sink-task-1", "sink-task-2", "plain-writer"
    state = prepare_in_a_process_then_kill_it(cluster, prepared_tid)
    ongoing = driver(cluster, ongoing_tid)
    plain = Producer(bootstrap=cluster.bootstrap, transactional_id=plain_tid,
                     transaction_timeout_ms=1000)
    try:
        ongoing.init_transactions()
        ongoing.begin_transaction()
        ongoing.send(TOPIC, value=f"{ongoing_tid}-0".encode(), partition=0)
        ongoing.flush()
        # Started last, with the same 1 s timeout as the two-phase ones.
        plain.init_transactions()
        plain.begin_transaction()
        plain.send(TOPIC, value=b"plain", partition=1)
        plain.flush()
        wait_txn_state(admin, plain_tid, "CompleteAbort")
        assert admin.describe_transaction(prepared_tid).state == "Prepared"
        assert admin.describe_transaction(ongoing_tid).state == "Ongoing"
        # The unprepared two-phase transaction still commits.
        ongoing.commit_transaction()
        wait_txn_state(admin, ongoing_tid, "CompleteCommit")
    finally:
        plain.close()
        ongoing.close()

    other = PreparedTxnState(state.producer_id, state.producer_epoch + 7)
    with driver(cluster, prepared_tid) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.prepared_transaction_state == state
        assert producer.complete_transaction(other) is False
        wait_txn_state(admin, prepared_tid, "CompleteAbort")
        # Asking about the real state now: it was aborted.
        assert producer.complete_transaction(state) is False
    # Read once the prepared transaction no longer holds the partitions' LSO.
    assert values(cluster.bootstrap, prepared_tid) == []
    assert values(cluster.bootstrap, ongoing_tid) == [f"{ongoing_tid}-0".encode()]
    assert b"plain" not in values(cluster.bootstrap, "")
    assert admin.find_hanging_transactions() == []


def test_close_leaves_a_prepared_transaction_the_admin_aborts_it_the_cli_shows_it(
        cluster: LocalCluster, admin: Admin) -> None:
    tid = "sink-task-3"
    with driver(cluster, tid) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, value=f"{tid}-0".encode(), partition=0)
        state = producer.prepare_transaction()
        assert producer.transaction_state == "prepared_transaction"
    # close() did not abort it: another process may still complete it.
    described = subprocess.run(
        [sys.executable, "-m", "oncelog.cli", "--bootstrap", cluster.bootstrap,
         "transactions", "describe", tid],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "state Prepared" in described
    assert f"two_phase_commit yes  prepared_transaction {state}" in described
    listed = admin.list_transactions(states=["Prepared"])
    assert [t.transactional_id for t in listed] == [tid]
    aborted = admin.abort_transaction(tid)
    assert aborted.state == "PrepareAbort"
    wait_txn_state(admin, tid, "CompleteAbort")
    assert values(cluster.bootstrap, tid) == []
