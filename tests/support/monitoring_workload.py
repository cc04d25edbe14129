"""A short workload that moves every oncelog metric the dashboards and alerts
use: idempotent and transactional produce, commits and aborts, a fenced
zombie producer, a transaction the coordinator times out, a read_committed
consumer, and a transaction left open (so the age of the oldest open
transaction and the LSO gap have values while Prometheus looks).

Each step is a function of the WorkloadState; STEPS runs in order. A step
for another service (consumer groups, say) is one more function appended to
STEPS. `finish()` ends what was left open, after the checks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster
from tests.support.reading import read_all
from tests.support.txn import wait_txn_state

# What the cluster under the workload needs: a fast coordinator timer (the
# timeout step), fsync and frequent snapshots (their metrics then move).
CLUSTER_ARGS: dict[str, list[str]] = {
    "coordinator": ["--transaction-check-interval-ms", "100"],
    "group_coordinator": ["--lag-refresh-interval-ms", "200"],
    "partition_store": ["--fsync", "--snapshot-interval-batches", "5"],
}
TOPIC = "monitoring"
PARTITIONS = 3
# The timed-out transaction's timeout.
SHORT_TXN_TIMEOUT_MS = 1000
_ids = itertools.count()


@dataclass
class WorkloadState:
    cluster: LocalCluster
    topic: str = TOPIC
    partitions: int = PARTITIONS
    # What to end after the checks, in reverse order (the open transaction).
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def transactional_id(self, what: str) -> str:
        return f"monitoring-{what}-{next(_ids)}"

    def finish(self) -> None:
        while self.closers:
            self.closers.pop()()


Step = Callable[[WorkloadState], None]


def create_topic(state: WorkloadState) -> None:
    with Admin(bootstrap=state.bootstrap) as admin:
        admin.create_topic(state.topic, partitions=state.partitions)


def idempotent_produce(state: WorkloadState) -> None:
    with Producer(bootstrap=state.bootstrap) as producer:
        futures = [producer.send(state.topic, value=b"plain-%d" % i) for i in range(200)]
        producer.flush()
        for future in futures:
            future.result(timeout=60)


def commit_and_abort(state: WorkloadState) -> None:
    with Producer(bootstrap=state.bootstrap,
                  transactional_id=state.transactional_id("commit-abort")) as producer:
        producer.init_transactions()
        for round_ in range(5):
            producer.begin_transaction()
            for i in range(20):
                producer.send(state.topic, value=b"txn-%d-%d" % (round_, i),
                              partition=i % state.partitions)
            if round_ % 2:
                producer.flush()
                producer.abort_transaction()
            else:
                producer.commit_transaction()


def fence_zombies(state: WorkloadState) -> None:
    """Two zombies, each fenced by a new instance with its transactional id:
    the first then writes to a partition of its transaction (the store
    refuses the batch), the second tries to commit (the coordinator refuses)."""
    for late_action in ("send", "commit"):
        transactional_id = state.transactional_id(f"zombie-{late_action}")
        zombie = Producer(bootstrap=state.bootstrap, transactional_id=transactional_id)
        try:
            zombie.init_transactions()
            zombie.begin_transaction()
            zombie.send(state.topic, value=b"zombie", partition=0).result(timeout=60)
            with Producer(bootstrap=state.bootstrap,
                          transactional_id=transactional_id) as successor:
                successor.init_transactions()  # fences the zombie, aborts its transaction
                if late_action == "send":
                    refused = zombie.send(state.topic, value=b"zombie-late", partition=0)
                    if not isinstance(refused.exception(timeout=60), errors.OncelogError):
                        raise AssertionError("the fenced zombie's send was accepted")
                else:
                    try:
                        zombie.commit_transaction()
                    except errors.OncelogError:
                        pass
                    else:
                        raise AssertionError("the fenced zombie's commit was accepted")
                successor.begin_transaction()
                successor.send(state.topic, value=b"successor", partition=1)
                successor.commit_transaction()
        finally:
            zombie.close()


def consume_in_a_group(state: WorkloadState) -> None:
    """A group member reads part of the topic and commits: members, epoch,
    rebalances, committed offsets and (the rest unread) lag get values; a
    transactional offset commit makes the pending gauge move."""
    group = "monitoring-group"
    with Consumer(bootstrap=state.bootstrap, group_id=group, session_timeout_ms=3000,
                  max_poll_records=1) as consumer:
        consumer.subscribe([state.topic])
        deadline = time.monotonic() + 60
        records: list[ConsumerRecord] = []
        while not records:
            if time.monotonic() > deadline:
                raise AssertionError("the group member read nothing")
            records = consumer.poll(timeout=0.5)
        consumer.commit()
        with Producer(bootstrap=state.bootstrap,
                      transactional_id=state.transactional_id("group")) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send_offsets_to_transaction(
                {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records},
                consumer.group_metadata(),
            )
            producer.commit_transaction()
    # The member left; the group stays (empty) with its committed offsets,
    # and the records it did not read are its lag.


def time_out_a_transaction(state: WorkloadState) -> None:
    transactional_id = state.transactional_id("timeout")
    with Producer(bootstrap=state.bootstrap, transactional_id=transactional_id,
                  transaction_timeout_ms=SHORT_TXN_TIMEOUT_MS) as producer, \
            Admin(bootstrap=state.bootstrap) as admin:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(state.topic, value=b"too-slow", partition=2).result(timeout=60)
        wait_txn_state(admin, transactional_id, "CompleteAbort")


def read_committed(state: WorkloadState) -> None:
    records = read_all(state.bootstrap, state.topic, state.partitions,
                       isolation_level="read_committed")
    if not records:
        raise AssertionError("the read_committed consumer read nothing")


def hold_a_transaction_open(state: WorkloadState) -> None:
    producer = Producer(bootstrap=state.bootstrap,
                        transactional_id=state.transactional_id("held-open"))
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(state.topic, value=b"held", partition=0).result(timeout=60)
        # Committed records behind it: the LSO gap is then more than its own batch.
        with Producer(bootstrap=state.bootstrap) as plain:
            plain.send(state.topic, value=b"behind-the-open-one", partition=0).result(timeout=60)
    except BaseException:
        producer.close()
        raise

    def end() -> None:
        try:
            producer.abort_transaction()
        finally:
            producer.close()

    state.closers.append(end)


STEPS: list[Step] = [
    create_topic,
    idempotent_produce,
    commit_and_abort,
    fence_zombies,
    time_out_a_transaction,
    read_committed,
    consume_in_a_group,
    hold_a_transaction_open,
]


def run_workload(cluster: LocalCluster, steps: list[Step] | None = None) -> WorkloadState:
    """Runs the steps in order; on failure, ends what earlier steps left open."""
    state = WorkloadState(cluster)
    try:
        for step in STEPS if steps is None else steps:
            step(state)
    except BaseException:
        state.finish()
        raise
    return state
