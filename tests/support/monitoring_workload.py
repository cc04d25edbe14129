"""A short workload that moves every oncelog metric the dashboards and alerts
use: idempotent and transactional produce, commits and aborts, a fenced
zombie producer, a transaction the coordinator times out, a read_committed
consumer, a leader deposed while it is paused (leader elections, ISR shrinks
and expands, replica lag, a truncated tail), and a transaction left open (so
the age of the oldest open transaction and the LSO gap have values while
Prometheus looks).

The cluster is replicated, as the Helm chart deploys it: three stores and
an etcd (CLUSTER_OPTIONS). Each step is a function of the WorkloadState;
STEPS runs in order. A step for another service (consumer groups, say) is
one more function appended to STEPS. `finish()` ends what was left open,
after the checks.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oncelog import Admin, Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster, PartitionPlacement
from tests.support.reading import read_all
from tests.support.txn import wait_txn_state

# What the cluster under the workload needs: a fast coordinator timer (the
# timeout step), fsync and frequent snapshots (their metrics then move).
CLUSTER_ARGS: dict[str, list[str]] = {
    "coordinator": ["--transaction-check-interval-ms", "100"],
    "group_coordinator": ["--lag-refresh-interval-ms", "200"],
    "partition_store": ["--fsync", "--snapshot-interval-batches", "5"],
}
STORES = 3
# LocalCluster's arguments: replicated (RF 3, min ISR 2), with a lease and a
# lag limit short enough for the leader step to take seconds, not minutes
# (and leadership moved back to preferred replicas every second, not every
# five minutes).
CLUSTER_OPTIONS: dict[str, Any] = {
    "partition_stores": STORES,
    "etcd_members": 1,
    "env": {"ONCELOG_LEASE_TTL_S": "2", "ONCELOG_REPLICA_LAG_TIME_MAX_MS": "3000",
            "ONCELOG_LEADER_IMBALANCE_CHECK_INTERVAL_MS": "1000"},
    "extra_args": CLUSTER_ARGS,
    # Every store with a Kafka listener: a store without one never imports
    # the listener's code, and so exports none of its metrics, which the
    # documented-metrics check must see too.
    "kafka_listener": True,
}
TOPIC = "monitoring"
PARTITIONS = 3
# The topic whose leader the leader step deposes (one partition).
REPLICATED_TOPIC = "monitoring-replicated"
# Failure guards of the leader step: it takes seconds.
LEADER_CHANGE_TIMEOUT_S = 60.0
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
        """Every store: a client starts while any one of them is down."""
        return ",".join(p.address for p in self.cluster.processes["partition_store"])

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


def _partition_states(cluster: LocalCluster, topic: str) -> list[PartitionPlacement]:
    """(leader, leader epoch, replicas, ISR) of each partition ([] when no
    store answers Metadata within a second; a paused one does not)."""
    return [state for _key, state in sorted(cluster.partition_states([topic]).items())]


def _wait_until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + LEADER_CHANGE_TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {LEADER_CHANGE_TIMEOUT_S} s waiting "
                                 f"for {what}")
        time.sleep(0.1)


def _in_sync(cluster: LocalCluster, topic: str, *, min_epoch: int = 0,
             preferred: bool = True) -> bool:
    """Every partition at leader epoch min_epoch or later; with `preferred`,
    also led by its preferred replica with every replica in sync."""
    states = _partition_states(cluster, topic)
    return bool(states) and all(
        state.leader_epoch >= min_epoch and (not preferred or (state.preferred and state.in_sync))
        for state in states)


def _truncations(cluster: LocalCluster, node_id: int, topic: str) -> float:
    url = cluster.metrics_url("partition_store", node_id)
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read().decode()
    found = re.search(
        rf'^oncelog_store_replica_truncations_total\{{topic="{re.escape(topic)}"\}} (\S+)$',
        body, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def depose_a_leader(state: WorkloadState) -> None:
    """Pauses (SIGSTOP) the leader of a partition past its etcd lease: the
    controller elects another leader and drops the paused store from the
    ISRs it was in. Records a producer pinned to the paused leader sent
    meanwhile are appended there when it resumes, never acknowledged, and cut
    off again once it follows the new leader (a truncation); it catches up,
    rejoins the ISRs and, back in sync, leads its preferred partitions again.
    Repeated (up to 3 times) in the rare run where the resumed store learns
    of the new leader before it appends the late records: then nothing is
    truncated."""
    cluster = state.cluster
    with Admin(bootstrap=state.bootstrap) as admin:
        admin.create_topic(REPLICATED_TOPIC, partitions=1)   # the default: 3 copies
    _wait_until(f"{REPLICATED_TOPIC} in sync", lambda: _in_sync(cluster, REPLICATED_TOPIC))
    for _attempt in range(3):
        [(leader, epoch, _replicas, _isr)] = _partition_states(cluster, REPLICATED_TOPIC)
        truncated_before = _truncations(cluster, leader, REPLICATED_TOPIC)
        pinned = Producer(bootstrap=cluster.address("partition_store", leader), linger_ms=0,
                          delivery_timeout_ms=30_000, request_timeout_ms=5_000)
        try:
            for future in [pinned.send(REPLICATED_TOPIC, value=b"before-%d" % i, partition=0)
                           for i in range(10)]:
                future.result(timeout=60)
            cluster.pause("partition_store", leader)
            try:
                _wait_until("a new leader", functools.partial(
                    _in_sync, cluster, REPLICATED_TOPIC, min_epoch=epoch + 1, preferred=False))
                # Bootstrapped from the live stores only: a paused one would
                # hold its first request until the request timeout.
                live = ",".join(p.address for p in cluster.processes["partition_store"]
                                if p.node_id != leader)
                with Producer(bootstrap=live, linger_ms=0) as other:
                    other.send(REPLICATED_TOPIC, value=b"new", partition=0).result(timeout=60)
                late = [pinned.send(REPLICATED_TOPIC, value=b"late-%d" % i, partition=0)
                        for i in range(10)]
                time.sleep(0.5)
            finally:
                cluster.resume("partition_store", leader)
            # Two epochs on: the new leader's, then the preferred replica's
            # again, which it gets back only once it has truncated, caught up
            # and rejoined the ISR. (The resumed store's own first answers
            # still show the epoch it was paused at.)
            _wait_until(f"{REPLICATED_TOPIC} led by its preferred replica again",
                        functools.partial(_in_sync, cluster, REPLICATED_TOPIC,
                                          min_epoch=epoch + 2))
            for future in late:
                with contextlib.suppress(errors.OncelogError):
                    future.result(timeout=60)
        finally:
            pinned.close(timeout=10)
        if _truncations(cluster, leader, REPLICATED_TOPIC) > truncated_before:
            break
    else:
        raise AssertionError(f"a deposed leader of {REPLICATED_TOPIC} truncated nothing in "
                             "3 attempts")
    # The steps after this one run on a settled cluster.
    for topic in (state.topic, "__transaction_state", "__consumer_offsets"):
        _wait_until(f"{topic} in sync", functools.partial(_in_sync, cluster, topic))


STEPS: list[Step] = [
    create_topic,
    idempotent_produce,
    commit_and_abort,
    fence_zombies,
    time_out_a_transaction,
    read_committed,
    consume_in_a_group,
    depose_a_leader,
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
