"""Hanging transactions heal themselves, on real processes.

Goal: the three ways a transaction hangs in Kafka, each shown pinning a
partition's last stable offset (read_committed readers stop at it while
committed records wait above it), then released by the partition's store
past the transaction's timeout plus the margin, without an operator; the
records of the hung transaction stay invisible and every committed record
becomes visible (committed data is never aborted):

(a) KIP-890's late produce: a batch of a version-1 transaction (Kafka's
    clients: the abort keeps the epoch) that arrives after its ABORT marker.
    With verification the store refuses it (and a version-2 producer's late
    batch is fenced by the bumped epoch alone): no pin. Without verification
    (the test-only switch) it opens a transaction nobody will end; the store
    asks, the coordinator answers that its last decision's marker is already
    there (nobody knows this transaction), and the store aborts it.
(b) a marker lost while the coordinator dies: the coordinator is killed right
    after its abort decision is durable (markers in flight), and the store
    holding `__transaction_state` is wiped, so the decision is lost with it;
    the data partition's store aborts the transaction itself.
(c) a coordinator's log rolled back by an unclean election: a replicated
    cluster whose `__transaction_state` follower falls out of the ISR, the
    transaction's records written to the others, those killed, the stale
    follower elected uncleanly; the coordinator reloads a log without the
    transaction, and the data partition's store aborts it.

Method: LocalCluster (the stores with `--hanging-txn-margin-ms 1000` and a
bound of 8 s on unknown timeouts, as the coordinators' maximum), the SDK's
producers and raw gRPC for what a client would not send; crash points,
kill, wipe, SIGSTOP and `--unclean-leader-election` for the faults. Reads
are raw read_committed Fetches at the partition's store. Waits are bounded
polls of what the servers report, never timed assertions: the store's log
line names the transaction's age when it was aborted, checked to be past
its timeout plus the margin (never early); how soon after that it happened
is measured, not asserted.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from oncelog import Admin, Producer, errors
from oncelog.errors import ErrorCode
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as co
from oncelog.v1 import coordinator_pb2_grpc as co_grpc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.v1 import records_pb2
from oncelog.wire.placement import stable_hash
from oncelog.wire.records import encode_batch, iter_records, read_header
from tests.support.polling import retrying, wait_until

TIMEOUT_MS = 5_000           # the producers' transaction timeout
BOUND_MS = 8_000             # the coordinators' maximum, the stores' bound
MARGIN_MS = 1_000
STORE_ARGS = ["--hanging-txn-margin-ms", str(MARGIN_MS),
              "--max-transaction-timeout-ms", str(BOUND_MS)]
COORDINATOR_ARGS = ["--max-transaction-timeout-ms", str(BOUND_MS),
                    "--transaction-check-interval-ms", "100"]
CRASH_POINTS = "ONCELOG_TEST_CRASH_POINTS"
AUTO_ABORTED = "oncelog_store_auto_aborted_transactions_total"
# Long enough for every timeout, margin and restart on a loaded machine.
DEADLINE_S = 90.0
_ABORTED_LINE = re.compile(
    r"(?P<topic>\S+)-(?P<partition>\d+): the transaction of producer (?P<pid>\d+) \(epoch "
    r"\d+\) open since offset (?P<first>\d+) for (?P<age>\d+) ms, past its timeout of "
    r"(?P<timeout>\d+) ms plus the margin of (?P<margin>\d+) ms: no transaction coordinator "
    r"knows it")


@contextmanager
def _stubs(cluster: LocalCluster, store: int = 0,
           ) -> Iterator[tuple[co_grpc.TransactionCoordinatorStub, ps_grpc.PartitionStoreStub]]:
    with grpc.insecure_channel(cluster.address("coordinator")) as coordinator, \
            grpc.insecure_channel(cluster.address("partition_store", store)) as data_store:
        yield co_grpc.TransactionCoordinatorStub(coordinator), ps_grpc.PartitionStoreStub(
            data_store)


def _produce(store: ps_grpc.PartitionStoreStub, topic: str, tid: str, pid: int, epoch: int,
             seq: int, value: str) -> ps.PartitionProduceResult:
    batch = encode_batch([(None, value.encode(), None, 1_700_000_000_000)], producer_id=pid,
                         producer_epoch=epoch, base_sequence=seq, transactional=True)
    [result] = retrying(lambda: store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=topic, partition=0, batch=batch)],
        transactional_id=tid, timeout_ms=10_000), timeout=30)).results
    return result


def _partition(store: ps_grpc.PartitionStoreStub, topic: str) -> tuple[list[str], int, int]:
    """What read_committed returns of partition 0 from offset 0, where it
    ends (the last stable offset) and the high watermark."""
    offset = 0
    values: list[str] = []
    while True:
        request = ps.FetchRequest(
            partitions=[ps.FetchPartition(topic=topic, partition=0, fetch_offset=offset)],
            isolation_level=records_pb2.READ_COMMITTED)
        [result] = retrying(lambda: store.Fetch(request, timeout=30)).results  # noqa: B023
        assert result.error.code == 0, result.error
        for data in result.batches:
            assert not read_header(data).is_control
            values.extend((r.value or b"").decode() for r in iter_records(data, min_offset=offset))
        if result.next_fetch_offset == offset:
            return values, offset, result.high_watermark
        offset = result.next_fetch_offset


def _wait_released(store: ps_grpc.PartitionStoreStub, topic: str) -> list[str]:
    """Waits until read_committed reaches the high watermark; returns what it read."""
    read: list[tuple[list[str], int, int]] = []

    def released() -> bool:
        read[:] = [_partition(store, topic)]
        return read[0][1] == read[0][2]

    wait_until(f"the last stable offset of {topic}-0 to reach its high watermark", released,
               deadline_s=DEADLINE_S)
    return read[0][0]


def _auto_aborted(cluster: LocalCluster, store: int, topic: str, resolution: str) -> float:
    with urllib.request.urlopen(cluster.metrics_url("partition_store", store),
                                timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == AUTO_ABORTED and sample.labels == {
                    "topic": topic, "resolution": resolution}:
                return float(sample.value)
    return 0.0


def _store_aborted(cluster: LocalCluster, store: int, topic: str, first_offset: int) -> int:
    """The age (ms) the store's log line gives the transaction it aborted
    itself from `first_offset`, checked past its timeout plus the margin."""
    lines = [m for m in _ABORTED_LINE.finditer(cluster.log_tail("partition_store", store, 400))
             if m["topic"] == topic]
    assert [int(m["first"]) for m in lines] == [first_offset], lines
    [line] = lines
    assert int(line["age"]) >= int(line["timeout"]) + int(line["margin"]) == \
        int(line["timeout"]) + MARGIN_MS
    return int(line["age"])


def _committer(cluster: LocalCluster, tid: str) -> Producer:
    producer = Producer(bootstrap=cluster.bootstrap, transactional_id=tid,
                        transaction_timeout_ms=TIMEOUT_MS)
    producer.init_transactions()
    return producer


def _commit(producer: Producer, topic: str, value: str) -> None:
    producer.begin_transaction()
    producer.send(topic, value=value.encode(), partition=0).result(timeout=60)
    producer.commit_transaction()


def test_a_late_batch_after_the_abort_is_refused_or_its_pin_healed(tmp_path: Path) -> None:
    topic = "late"
    with LocalCluster(tmp_path / "cluster", group_coordinators=0, extra_args={
        "partition_store": STORE_ARGS, "coordinator": COORDINATOR_ARGS,
    }) as cluster, Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
        committer = _committer(cluster, "late-committer")
        try:
            _commit(committer, topic, "committed-1")
            with _stubs(cluster) as (coordinator, store):
                # Version 1: the transaction writes, and its abort keeps the epoch.
                tid = "late-v1"
                reply = retrying(lambda: coordinator.InitProducerId(co.InitProducerIdRequest(
                    transactional_id=tid, transaction_timeout_ms=TIMEOUT_MS,
                    transaction_version=1), timeout=30))
                pid, epoch = reply.producer_id, reply.producer_epoch
                retrying(lambda: coordinator.AddPartitionsToTxn(co.AddPartitionsToTxnRequest(
                    transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                    partitions=[records_pb2.TopicPartition(topic=topic, partition=0)]),
                    timeout=30))
                assert _produce(store, topic, tid, pid, epoch, 0, "aborted-1").error.code == 0
                retrying(lambda: coordinator.EndTxn(co.EndTxnRequest(
                    transactional_id=tid, producer_id=pid, producer_epoch=epoch, commit=False),
                    timeout=30))
                assert _wait_released(store, topic) == ["committed-1"]
                # Its batch arrives late, after the ABORT marker: verification refuses it.
                late = _produce(store, topic, tid, pid, epoch, 1, "late-1")
                assert ErrorCode.from_wire(late.error.code) is ErrorCode.INVALID_TXN_STATE
                # Version 2 (the SDK): the abort bumped the epoch, which fences
                # the late batch before any verification.
                with Producer(bootstrap=cluster.bootstrap, transactional_id="late-v2",
                              transaction_timeout_ms=TIMEOUT_MS) as v2:
                    v2.init_transactions()
                    v2.begin_transaction()
                    v2.send(topic, value=b"aborted-2", partition=0).result(timeout=60)
                    v2_pid, v2_epoch = v2.producer_id, v2.producer_epoch
                    v2.abort_transaction()
                # The abort returns once decided; the store learns the new
                # epoch from the ABORT marker, which follows. Before it
                # lands, a late batch still belongs to the open transaction
                # (and is aborted with it).
                assert _wait_released(store, topic) == ["committed-1"]
                late = _produce(store, topic, "late-v2", v2_pid, v2_epoch, 1, "late-2")
                assert ErrorCode.from_wire(late.error.code) is ErrorCode.PRODUCER_FENCED
                values, lso, high_watermark = _partition(store, topic)
                assert (values, lso) == (["committed-1"], high_watermark)

            # Without verification (the test-only switch) the version-1 late
            # batch opens a transaction that no coordinator will ever end.
            cluster.restart("partition_store", 0,
                            env={"ONCELOG_UNSAFE_SKIP_TXN_VERIFICATION": "true"})
            with _stubs(cluster) as (coordinator, store):
                late = _produce(store, topic, tid, pid, epoch, 1, "late-1")
                assert late.error.code == 0, late.error
                _commit(committer, topic, "committed-2")
                values, lso, high_watermark = _partition(store, topic)
                # Pinned: the committed record waits behind the late batch.
                assert (values, lso) == (["committed-1"], late.base_offset)
                assert high_watermark > lso
                assert _wait_released(store, topic) == ["committed-1", "committed-2"]
            # The store aborted it itself (its timeout unknown: the bound).
            age_ms = _store_aborted(cluster, 0, topic, late.base_offset)
            assert age_ms >= BOUND_MS + MARGIN_MS
            print(f"late produce: aborted by the store {age_ms} ms after the late batch "
                  f"(bound {BOUND_MS} ms + margin {MARGIN_MS} ms)")
            assert _auto_aborted(cluster, 0, topic, "store") == 1
        finally:
            committer.close()


def _name_placed(prefix: str, index: int, stores: int) -> str:
    """A topic name whose partition 0 `store_for` (single copies) and
    `assign_replicas` (replicated, one replica) both put on store `index`."""
    for n in range(10_000):
        name = f"{prefix}-{n}"
        if stable_hash(name) % stores == index:
            return name
    raise AssertionError("no name found")


def test_a_decision_lost_with_its_coordinator_and_its_record_is_healed(tmp_path: Path) -> None:
    # Two stores: the data on store 0; __transaction_state (one partition)
    # and __producer_ids on store 1, which the test wipes.
    topic = _name_placed("lost-record", 0, 2)
    with LocalCluster(tmp_path / "cluster", partition_stores=2, group_coordinators=0,
                      transaction_state_partitions=1, extra_args={
                          "partition_store": STORE_ARGS, "coordinator": COORDINATOR_ARGS,
                      }) as cluster, Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
        [placed] = admin.describe_topic(topic).partitions
        assert placed.leader_node_id == 0
        committer = _committer(cluster, "lost-committer")
        plain = Producer(bootstrap=cluster.bootstrap)
        hung = None
        try:
            _commit(committer, topic, "committed-1")
            plain.send(topic, value=b"warm-up", partition=0).result(timeout=60)
            # The coordinator dies right after the abort decision is durable,
            # before any marker goes out.
            cluster.restart("coordinator", 0, env={CRASH_POINTS: "coordinator.after_prepare"})
            hung = Producer(bootstrap=cluster.bootstrap, transactional_id="lost-hung",
                            transaction_timeout_ms=TIMEOUT_MS, delivery_timeout_ms=20_000)
            hung.init_transactions()
            hung.begin_transaction()
            first = hung.send(topic, value=b"hung-1", partition=0).result(timeout=60).offset
            hung.send(topic, value=b"hung-2", partition=0).result(timeout=60)
            plain.send(topic, value=b"after", partition=0).result(timeout=60)
            ending = threading.Thread(target=_abort_quietly, args=(hung,))
            ending.start()
            assert cluster.wait_exit("coordinator", 0) != 0, "the crash point did not fire"
            # Its record is lost: the store that held __transaction_state is wiped.
            cluster.kill("partition_store", 1)
            cluster.wipe("partition_store", 1)
            cluster.restart("partition_store", 1)
            with _stubs(cluster) as (_coordinator, store):
                values, lso, high_watermark = _partition(store, topic)
                assert (values, lso) == (["committed-1", "warm-up"], first)
                assert high_watermark > lso
                cluster.restart("coordinator", 0, env={CRASH_POINTS: ""})
                assert _wait_released(store, topic) == ["committed-1", "warm-up", "after"]
            ending.join(60)
            age_ms = _store_aborted(cluster, 0, topic, first)
            print(f"lost record: aborted by the store {age_ms} ms after its first batch "
                  f"(timeout {TIMEOUT_MS} ms + margin {MARGIN_MS} ms)")
            assert _auto_aborted(cluster, 0, topic, "store") == 1
        finally:
            for producer in (committer, plain, hung):
                if producer is not None:
                    producer.close()


def _abort_quietly(producer: Producer) -> None:
    """The hung producer's abort: it cannot succeed (its coordinator dies and
    forgets it); whatever it raises is expected."""
    with suppress(errors.OncelogError):
        producer.abort_transaction()


def test_a_coordinator_log_rolled_back_by_an_unclean_election_is_healed(tmp_path: Path) -> None:
    # Four replicated stores: __transaction_state-0 on three of them (RF 3,
    # min ISR 2), the data (one replica) on the fourth, which stays up.
    with LocalCluster(tmp_path / "cluster", partition_stores=4, group_coordinators=0,
                      etcd_members=1, transaction_state_partitions=1,
                      env={"ONCELOG_LEASE_TTL_S": "2"}, extra_args={
                          "partition_store": [*STORE_ARGS, "--unclean-leader-election",
                                              "--replica-lag-time-max-ms", "1000"],
                          "coordinator": COORDINATOR_ARGS,
                      }) as cluster, Admin(bootstrap=cluster.bootstrap) as admin:
        cluster.wait_in_sync(timeout_s=DEADLINE_S)
        txn_state = cluster.partition_states(["__transaction_state"])[("__transaction_state", 0)]
        leader = txn_state.leader
        stale, follower = [r for r in txn_state.replicas if r != leader]
        [data_store] = set(range(4)) - set(txn_state.replicas)
        topic = _name_placed("rolled-back", data_store, 4)
        admin.create_topic(topic, partitions=1, replication_factor=1)
        cluster.wait_in_sync([topic], timeout_s=DEADLINE_S)
        committer = _committer(cluster, "rollback-committer")
        hung = None
        try:
            _commit(committer, topic, "committed-1")
            # The stale follower falls out of the ISR; what follows is on the
            # leader and the other follower only.
            cluster.pause("partition_store", stale)
            wait_until("the paused follower to leave the ISR", lambda: stale not in (
                cluster.partition_states(["__transaction_state"], stores=[leader])
                .get(("__transaction_state", 0), txn_state).isr), deadline_s=DEADLINE_S)
            # The longest timeout allowed: the coordinator must not abort it
            # by itself before the rollback.
            hung = Producer(bootstrap=cluster.bootstrap, transactional_id="rollback-hung",
                            transaction_timeout_ms=BOUND_MS)
            hung.init_transactions()
            hung.begin_transaction()
            first = hung.send(topic, value=b"hung-1", partition=0).result(timeout=60).offset
            _commit(committer, topic, "committed-2")
            with _stubs(cluster, data_store) as (_coordinator, store):
                values, lso, high_watermark = _partition(store, topic)
                assert (values, lso) == (["committed-1"], first)
                assert high_watermark > lso
                # Both in-sync replicas die; the stale one comes back and is
                # elected uncleanly: the transaction's records are gone.
                cluster.kill("partition_store", leader)
                cluster.kill("partition_store", follower)
                cluster.resume("partition_store", stale)
                wait_until("the stale follower to lead __transaction_state-0", lambda: (
                    cluster.partition_states(["__transaction_state"], stores=[data_store, stale])
                    .get(("__transaction_state", 0), txn_state).leader == stale),
                    deadline_s=DEADLINE_S)
                assert _wait_released(store, topic) == ["committed-1", "committed-2"]
            age_ms = _store_aborted(cluster, data_store, topic, first)
            print(f"unclean election: aborted by the store {age_ms} ms after its first batch "
                  f"(timeout {BOUND_MS} ms + margin {MARGIN_MS} ms)")
            assert _auto_aborted(cluster, data_store, topic, "store") == 1
        finally:
            for producer in (committer, hung):
                if producer is not None:
                    producer.close()
