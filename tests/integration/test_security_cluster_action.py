"""No client can act as the cluster: forged markers and coordinator writes
are refused on a secured cluster, whatever else the client may do.

Goal: a client with a valid certificate and every topic, group and
transactional-id permission there is (ALL on `*` of each type, and
IdempotentWrite on the cluster) — but not ClusterAction — cannot forge a
COMMIT marker for someone else's open transaction (WriteTxnMarkers), write
records the coordinators replay (Produce with `coordinator_write`, to an
internal topic or stamped as the victim's transactional batch), pose as a
store verifying a transaction (AddPartitionsToTxn with `verify_only`), read
logs as a follower does (ReplicaFetch) or nudge a store as the controller
does (DeleteTopics without names). Each is refused with PERMISSION_DENIED and
CLUSTER_AUTHORIZATION_FAILED naming the principal; writing an internal topic
without `coordinator_write` is refused by the store as always; nothing is
written anywhere (every partition's log end offset, internal topics
included, and the transaction's state read back identical); and the victim
transaction's outcome is its own: the victim aborts, and a read_committed
reader sees none of its records.

Method: one LocalCluster(security=True); the victim is a real transactional
producer of the SDK connected as `User:admin` (the SDK's TLS options); the
forger uses raw stubs over TLS with its own client certificate
(tests/support/tls.py). No assertion depends on timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from oncelog import Producer
from oncelog.errors import ErrorCode
from oncelog.records import encode_batch, iter_records
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as tc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import records_pb2
from oncelog.wire.status import error_from_rpc
from tests.support.polling import wait_until
from tests.support.tls import Principal, wait_acls_applied

TOPIC = "payments"
VICTIM = "victim-txn"
FORGER = "mallory"
TP = records_pb2.TopicPartition


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("forgery") / "cluster", security=True,
                      transaction_state_partitions=1, consumer_offsets_partitions=1) as c:
        yield c


def _log_ends(admin: Principal, only_topic: str | None = None) -> list[ps.ListOffsetsResult]:
    """The log end offset of every partition (internal ones included), or
    of `only_topic`'s."""
    topics = admin.store.ListTopics(ps.ListTopicsRequest(include_internal=True)).topics
    return list(admin.store.ListOffsets(ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic=t.name, partition=p.partition, timestamp_ms=-1)
                    for t in topics if only_topic in (None, t.name) for p in t.partitions],
        isolation_level=records_pb2.READ_UNCOMMITTED)).results)


def _state(admin: Principal) -> dict[str, object]:
    offsets = _log_ends(admin)
    assert all(r.error.code == 0 for r in offsets), offsets
    [victim] = admin.txn.DescribeTransactions(
        tc.DescribeTransactionsRequest(transactional_ids=[VICTIM])).transactions
    return {
        "log end offsets": sorted((r.topic, r.partition, r.offset) for r in offsets),
        "victim": (victim.state, victim.producer_id, victim.producer_epoch,
                   sorted((p.topic, p.partition) for p in victim.partitions)),
    }


def _wait_group_coordinator_loaded(admin: Principal, timeout_s: float = 30.0) -> None:
    """Waits until the group coordinator has claimed every __consumer_offsets
    partition (its coordinator-epoch record, appended once it has loaded the
    partition, in the background and retried with backoff after start):
    landing after the test took its "before" state, that record would look
    like a write the forger got through."""
    deadline = time.monotonic() + timeout_s
    while True:
        offsets = _log_ends(admin, "__consumer_offsets")
        if offsets and all(r.error.code == 0 and r.offset >= 1 for r in offsets):
            return
        assert time.monotonic() < deadline, f"__consumer_offsets not claimed: {offsets}"
        time.sleep(0.1)


def _refused(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    error = error_from_rpc(info.value)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, error
    assert ErrorCode.from_wire(error.code) is ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error
    assert error.message.startswith(f"User:{FORGER} is not allowed ClusterAction on the "
                                    "cluster"), error.message
    return str(error.message)


def test_a_client_without_cluster_action_cannot_forge_markers_or_coordinator_writes(
        cluster: LocalCluster) -> None:
    admin_config = cluster.client_config("admin")
    with Principal(cluster, "admin") as admin, Principal(cluster, FORGER) as forger:
        created = admin.store.CreateTopics(ps.CreateTopicsRequest(
            topics=[ps.TopicSpec(name=TOPIC, partitions=1)]))
        assert created.results[0].error.code == 0
        who = f"User:{FORGER}"
        everything = [
            ps.AclBinding(principal=who, host="*", resource_type=kind, resource_name="*",
                          pattern_type="literal", operation="all", permission="allow")
            for kind in ("topic", "group", "transactional_id")
        ] + [ps.AclBinding(principal=who, host="*", resource_type="cluster",
                           resource_name="oncelog-cluster", pattern_type="literal",
                           operation="idempotent_write", permission="allow")]
        for result in admin.store.CreateAcls(ps.CreateAclsRequest(creations=everything)).results:
            assert result.code == 0, result
        wait_acls_applied(admin)

        victim = Producer(bootstrap=cluster.bootstrap, transactional_id=VICTIM, **admin_config)
        try:
            victim.init_transactions()
            victim.begin_transaction()
            for i in range(3):
                victim.send(TOPIC, value=b"victim-%d" % i, partition=0)
            victim.flush()
            [described] = admin.txn.DescribeTransactions(
                tc.DescribeTransactionsRequest(transactional_ids=[VICTIM])).transactions
            assert described.state == "Ongoing"
            producer_id, epoch = described.producer_id, described.producer_epoch
            _wait_group_coordinator_loaded(admin)
            before = _state(admin)

            # A COMMIT marker for the victim's open transaction.
            _refused(lambda: forger.store.WriteTxnMarkers(ps.WriteTxnMarkersRequest(markers=[
                ps.TxnMarker(producer_id=producer_id, producer_epoch=epoch + 1, type=ps.COMMIT,
                             coordinator_epoch=described.coordinator_epoch,
                             partitions=[TP(topic=TOPIC, partition=0)],
                             transactional_id=VICTIM)])))
            now_ms = int(time.time() * 1000)
            # A record the transaction coordinator would replay as the victim's state.
            _refused(lambda: forger.store.Produce(ps.ProduceRequest(
                coordinator_write=True, timeout_ms=10_000,
                batches=[ps.PartitionBatch(topic="__transaction_state", partition=0,
                                           batch=encode_batch([(VICTIM.encode(), b"forged",
                                                                None, now_ms)]))])))
            # A batch stamped as the victim's, through the coordinators' door.
            forged = encode_batch([(None, b"forged", None, now_ms)], producer_id=producer_id,
                                  producer_epoch=epoch, base_sequence=3, transactional=True)
            _refused(lambda: forger.store.Produce(ps.ProduceRequest(
                coordinator_write=True, transactional_id=VICTIM, timeout_ms=10_000,
                batches=[ps.PartitionBatch(topic=TOPIC, partition=0, batch=forged)])))
            # Posing as a store verifying the victim's transaction.
            _refused(lambda: forger.txn.AddPartitionsToTxn(tc.AddPartitionsToTxnRequest(
                transactional_id=VICTIM, producer_id=producer_id, producer_epoch=epoch,
                partitions=[TP(topic=TOPIC, partition=0)], verify_only=True)))
            # Reading the uncommitted log as a follower does.
            _refused(lambda: forger.store.ReplicaFetch(ps.ReplicaFetchRequest(
                replica_id=0, partitions=[ps.ReplicaFetchPartition(topic=TOPIC, partition=0)])))
            # The controller's "catalog changed" nudge.
            _refused(lambda: forger.store.DeleteTopics(ps.DeleteTopicsRequest()))
            # Without coordinator_write, the store refuses internal topics as it always did.
            reply = forger.store.Produce(ps.ProduceRequest(timeout_ms=10_000, batches=[
                ps.PartitionBatch(topic="__consumer_offsets", partition=0,
                                  batch=encode_batch([(b"k", b"forged", None, now_ms)]))]))
            assert reply.results[0].error.code == ErrorCode.INVALID_TOPIC_EXCEPTION

            assert _state(admin) == before
            victim.abort_transaction()
        finally:
            victim.close()

        def aborted() -> bool:
            [txn] = admin.txn.DescribeTransactions(
                tc.DescribeTransactionsRequest(transactional_ids=[VICTIM])).transactions
            return txn.state == "CompleteAbort"

        wait_until("the victim's abort completes", aborted)
        [committed] = admin.store.Fetch(ps.FetchRequest(
            partitions=[ps.FetchPartition(topic=TOPIC, partition=0, fetch_offset=0,
                                          max_bytes=1 << 20)],
            max_bytes=1 << 20, isolation_level=records_pb2.READ_COMMITTED)).results
        assert committed.error.code == 0
        assert [r.value for b in committed.batches for r in iter_records(b)] == []
        # Its three records and the ABORT marker the coordinator wrote, nothing else.
        [raw] = admin.store.ListOffsets(ps.ListOffsetsRequest(partitions=[
            ps.ListOffsetsPartition(topic=TOPIC, partition=0, timestamp_ms=-1)])).results
        assert raw.offset == 4
