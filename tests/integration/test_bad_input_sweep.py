"""Bad input to every RPC of the three services, through raw gRPC stubs.

Goal: the project rule "bad input gets a clear error naming what was wrong
and changes nothing already stored", for the inputs the other tests leave
out. Per case: the refusal is our Error with the expected code, never
retriable (the same request cannot succeed later): in the gRPC status's
details for a request-level refusal (the status never UNKNOWN or INTERNAL,
its message "<CODE>: <message>"), in the item's `error` for a per-item one (a
topic, partition, transactional id or group of a multi-item request); its
message names the offending field or value; and afterwards every service
still answers its health check and what was stored before the sweep — a
topic's records and end offsets, a committed transaction, committed group
offsets, the topic catalog, the transactional ids and groups, the internal
topics' log ends — is exactly as it was.

Over-long ids and topic names come in two sizes: just over the limit, and
far over it (an error that named such a value whole would not fit in a gRPC
status, whose trailers a client refuses past 16 KiB: the details were lost).

RPCs with no input to refuse: ListTopics (a bool), ListTransactions and
ListGroups (filters that match nothing answer an empty list, as Kafka's do).

Covered elsewhere and not repeated here: test_store_grpc.py (produce and
fetch of bad batches, sequences, unknown topics and partitions, offsets out
of range, topic names, partition counts and configs, an empty produce,
fetch or create, a negative fetch max_bytes, ListOffsets' bad timestamps),
test_store_txn_grpc.py (a transactional batch without transactional id, an
empty WriteTxnMarkers), test_group_coordinator.py (a negative offset, an
unknown topic or partition, an empty group id in OffsetCommit, member and
generation checks, markers under read_committed), test_node_client.py (a
zero transaction timeout), and the core's unit tests (producer id and epoch
checks and the transaction states: test_txn_state_machine.py; marker checks:
test_producer_state.py; session timeouts and empty subscriptions:
test_groups_core.py; topic specs: test_partition_store_topics.py).

Method: one LocalCluster for the module, with one partition of each internal
topic, so a coordinator that unloaded its partition over a bad request would
also fail the next read of the stored state. The state is set up with the
SDK; every case reads the state back (raw Fetch, ListOffsets,
DescribeTransactions, OffsetFetch, ...), sends its request, reads it again
and compares; a last test compares the state with the setup's. No
assertion depends on timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from oncelog import Admin, GroupMetadata, Producer, TopicPartition, errors
from oncelog.errors import ErrorCode
from oncelog.records import encode_batch, iter_records
from oncelog.testing import KINDS, LocalCluster
from oncelog.v1 import coordinator_pb2 as cpb
from oncelog.v1 import coordinator_pb2_grpc as cpb_grpc
from oncelog.v1 import errors_pb2, records_pb2
from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.v1 import group_coordinator_pb2_grpc as gpb_grpc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.status import STATUS_DETAILS_KEY, error_from_rpc
from services.common.kernel import limits
from tests.support.polling import retrying, wait_until

TOPIC = "sweep"
PARTITIONS = 2
# Enough partitions that their offsets with full metadata exceed one batch
# of __consumer_offsets (max.message.bytes 1 MiB; metadata up to 4 KiB).
WIDE = "sweep-wide"
WIDE_PARTITIONS = 300
TXN_ID = "sweep-tx"
GROUP = "sweep-g"
INTERNAL = ("__transaction_state", "__consumer_offsets", "__producer_ids")
# Just over the limit, and far over it (see the module's doc).
LONG_ID = "i" * (limits.MAX_ID_LENGTH + 1)
LONG_TOPIC = "t" * (limits.MAX_TOPIC_NAME_LENGTH + 1)
HUGE = "h" * 20_000
TWO_MB = "m" * 2_000_000
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]
T = TypeVar("T")
TP = records_pb2.TopicPartition


@dataclass
class Sweep:
    cluster: LocalCluster
    store: ps_grpc.PartitionStoreStub
    txn: cpb_grpc.TransactionCoordinatorStub
    groups: gpb_grpc.GroupCoordinatorStub
    health: dict[str, health_pb2_grpc.HealthStub]
    # TXN_ID's current producer id and epoch (its transaction is committed).
    producer_id: int = -1
    producer_epoch: int = -1


# ------------------------------------------------------------- stored state


def _read_back(s: Sweep, topic: str, partition: int, isolation: int) -> list[tuple[Any, ...]]:
    """Every record of the partition from offset 0: (offset, key, value)."""
    out: list[tuple[Any, ...]] = []
    offset = 0
    while True:
        [result] = s.store.Fetch(ps.FetchRequest(
            partitions=[ps.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)],
            isolation_level=records_pb2.IsolationLevel.ValueType(isolation),
        )).results
        assert result.error.code == 0, result.error
        out.extend((r.offset, r.key, r.value)
                   for b in result.batches for r in iter_records(b, min_offset=offset))
        if result.next_fetch_offset == offset:
            return out
        offset = result.next_fetch_offset


def _end_offset(s: Sweep, topic: str, partition: int, isolation: int) -> int:
    [result] = s.store.ListOffsets(ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic=topic, partition=partition, timestamp_ms=-1)],
        isolation_level=records_pb2.IsolationLevel.ValueType(isolation),
    )).results
    assert result.error.code == 0, result.error
    return result.offset


def observe(s: Sweep) -> dict[str, object]:
    """What is stored, read back through every service (each read must
    succeed: a service that cannot answer is not healthy)."""
    state: dict[str, object] = {}
    for kind in KINDS:
        assert s.cluster.processes[kind][0].alive(), f"{kind} exited"
        reply = s.health[kind].Check(health_pb2.HealthCheckRequest(service=""))
        state[f"{kind} health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    committed, uncommitted = records_pb2.READ_COMMITTED, records_pb2.READ_UNCOMMITTED
    for p in range(PARTITIONS):
        state[f"{TOPIC}-{p} end offsets"] = (_end_offset(s, TOPIC, p, uncommitted),
                                             _end_offset(s, TOPIC, p, committed))
        state[f"{TOPIC}-{p} records"] = _read_back(s, TOPIC, p, committed)
    state[f"{WIDE}-0 end offset"] = _end_offset(s, WIDE, 0, uncommitted)
    for topic in INTERNAL:
        # Nothing written to the coordinators' logs either.
        state[f"{topic}-0 end offset"] = _end_offset(s, topic, 0, uncommitted)
    state["topics"] = sorted(
        (t.name, t.topic_id, len(t.partitions), tuple(sorted(t.config.items())))
        for t in s.store.ListTopics(ps.ListTopicsRequest(include_internal=True)).topics
    )
    state["transactional ids"] = sorted(
        (t.transactional_id, t.producer_id, t.state)
        for t in s.txn.ListTransactions(cpb.ListTransactionsRequest()).transactions
    )
    [described] = s.txn.DescribeTransactions(
        cpb.DescribeTransactionsRequest(transactional_ids=[TXN_ID])).transactions
    assert described.error.code == 0, described.error
    state[TXN_ID] = (described.state, described.producer_id, described.producer_epoch,
                     described.transaction_timeout_ms, list(described.partitions))
    fetched = s.groups.OffsetFetch(gpb.OffsetFetchRequest(group_id=GROUP, require_stable=True))
    state[f"{GROUP} offsets"] = sorted(
        (p.topic, p.partition, p.offset, p.metadata, p.error.code) for p in fetched.partitions
    )
    state["groups"] = sorted(
        (g.group_id, g.state) for g in s.groups.ListGroups(gpb.ListGroupsRequest()).groups
    )
    return state


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sweep, dict[str, object]]]:
    # With a Kafka listener: test_kafka_bad_input.py sweeps it with this state.
    with LocalCluster(tmp_path_factory.mktemp("sweep") / "cluster",
                      transaction_state_partitions=1, consumer_offsets_partitions=1,
                      kafka_listener=True) as cluster:
        channels = {kind: grpc.insecure_channel(cluster.address(kind), options=CHANNEL_OPTIONS)
                    for kind in KINDS}
        try:
            s = Sweep(
                cluster=cluster,
                store=ps_grpc.PartitionStoreStub(channels["partition_store"]),
                txn=cpb_grpc.TransactionCoordinatorStub(channels["coordinator"]),
                groups=gpb_grpc.GroupCoordinatorStub(channels["group_coordinator"]),
                health={kind: health_pb2_grpc.HealthStub(ch) for kind, ch in channels.items()},
            )
            yield s, _store_something(s)
        finally:
            for channel in channels.values():
                channel.close()


def _store_something(s: Sweep) -> dict[str, object]:
    """Records, a committed transaction and committed offsets; returns the
    state once every part of it is settled."""
    bootstrap = s.cluster.bootstrap
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS)
        admin.create_topic(WIDE, partitions=WIDE_PARTITIONS)
    with Producer(bootstrap=bootstrap) as producer:
        for i in range(3):
            producer.send(TOPIC, value=b"plain-%d" % i, key=b"k%d" % i, partition=0)
        producer.flush()
    with Producer(bootstrap=bootstrap, transactional_id=TXN_ID) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(2):
            producer.send(TOPIC, value=b"txn-%d" % i, key=b"t", partition=1)
        producer.send_offsets_to_transaction(
            {TopicPartition(TOPIC, 0): 3},
            GroupMetadata(group_id=GROUP, generation_id=-1, member_id=""),
        )
        producer.commit_transaction()
    retrying(lambda: s.groups.OffsetCommit(gpb.OffsetCommitRequest(
        group_id=GROUP, generation_id=-1,
        partitions=[gpb.OffsetCommitPartition(topic=TOPIC, partition=1, offset=2,
                                              metadata="done")],
    )))

    def settled() -> bool:
        [txn] = s.txn.DescribeTransactions(
            cpb.DescribeTransactionsRequest(transactional_ids=[TXN_ID])).transactions
        offsets = s.groups.OffsetFetch(
            gpb.OffsetFetchRequest(group_id=GROUP, require_stable=True)).partitions
        s.producer_id, s.producer_epoch = txn.producer_id, txn.producer_epoch
        return (txn.state == "CompleteCommit"
                and {(p.topic, p.partition, p.offset) for p in offsets}
                == {(TOPIC, 0, 3), (TOPIC, 1, 2)})

    wait_until("the transaction's markers and offsets", settled)
    state = observe(s)
    # The setup itself is what the sweep must leave unchanged.
    assert state[f"{TOPIC}-0 end offsets"] == (3, 3)
    assert state[f"{TOPIC}-1 end offsets"] == (3, 3)  # two records and the marker
    records = state[f"{TOPIC}-1 records"]
    assert isinstance(records, list) and [v for _o, _k, v in records] == [b"txn-0", b"txn-1"]
    return state


# -------------------------------------------------------------------- cases


Send = Callable[[Sweep], Any]
Item = Callable[[Any], errors_pb2.Error]


@dataclass(frozen=True)
class Case:
    id: str
    send: Send
    code: ErrorCode
    # Text the message must contain: the offending field or value.
    names: tuple[str, ...]
    # Where a per-item refusal is in the (successful) response; None: the
    # refusal is the call's gRPC status.
    item: Item | None = None


def refused(id: str, send: Send, code: ErrorCode, *names: str) -> Case:
    return Case(id, send, code, names)


def refused_item(id: str, send: Send, item: Item, code: ErrorCode, *names: str) -> Case:
    return Case(id, send, code, names, item)


def first_result(response: Any) -> errors_pb2.Error:
    return response.results[0].error


def first_topic(response: Any) -> errors_pb2.Error:
    return response.topics[0].error


def first_transaction(response: Any) -> errors_pb2.Error:
    return response.transactions[0].error


def first_group(response: Any) -> errors_pb2.Error:
    return response.groups[0].error


# ---- TransactionCoordinator

def find_coordinator(key: str, kind: int) -> Send:
    return lambda s: s.txn.FindCoordinator(cpb.FindCoordinatorRequest(
        key=key, type=cpb.CoordinatorType.ValueType(kind)))


def init_producer_id(transactional_id: str, timeout_ms: int = 60_000, **flags: bool) -> Send:
    return lambda s: s.txn.InitProducerId(cpb.InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
        producer_id=-1, producer_epoch=-1, **flags))


def add_partitions(partitions: list[tuple[str, int]], transactional_id: str = TXN_ID) -> Send:
    return lambda s: s.txn.AddPartitionsToTxn(cpb.AddPartitionsToTxnRequest(
        transactional_id=transactional_id, producer_id=s.producer_id,
        producer_epoch=s.producer_epoch,
        partitions=[TP(topic=t, partition=p) for t, p in partitions]))


def add_offsets(group_id: str, transactional_id: str = TXN_ID) -> Send:
    return lambda s: s.txn.AddOffsetsToTxn(cpb.AddOffsetsToTxnRequest(
        transactional_id=transactional_id, producer_id=s.producer_id,
        producer_epoch=s.producer_epoch, group_id=group_id))


def end_txn(transactional_id: str) -> Send:
    return lambda s: s.txn.EndTxn(cpb.EndTxnRequest(
        transactional_id=transactional_id, producer_id=s.producer_id,
        producer_epoch=s.producer_epoch, commit=True))


def prepare(transactional_id: str) -> Send:
    return lambda s: s.txn.PrepareTransaction(cpb.PrepareTransactionRequest(
        transactional_id=transactional_id, producer_id=s.producer_id,
        producer_epoch=s.producer_epoch))


def complete(transactional_id: str, *, with_state: bool = True) -> Send:
    def send(s: Sweep) -> Any:
        request = cpb.CompleteTransactionRequest(
            transactional_id=transactional_id, producer_id=s.producer_id,
            producer_epoch=s.producer_epoch)
        if with_state:
            request.prepared_transaction.CopyFrom(cpb.PreparedTxnState(
                producer_id=s.producer_id, producer_epoch=s.producer_epoch))
        return s.txn.CompleteTransaction(request)
    return send


def abort_txn(transactional_id: str) -> Send:
    return lambda s: s.txn.AbortTransaction(
        cpb.AbortTransactionRequest(transactional_id=transactional_id))


def describe_txn(transactional_id: str) -> Send:
    return lambda s: s.txn.DescribeTransactions(
        cpb.DescribeTransactionsRequest(transactional_ids=[transactional_id]))


COORDINATOR_CASES = [
    refused("FindCoordinator-empty key", find_coordinator("", cpb.TRANSACTION),
            ErrorCode.INVALID_REQUEST, "key"),
    refused("FindCoordinator-unknown type 7", find_coordinator(TXN_ID, 7),
            ErrorCode.INVALID_REQUEST, "type 7"),
    refused("FindCoordinator-negative type", find_coordinator(TXN_ID, -1),
            ErrorCode.INVALID_REQUEST, "type -1"),
    refused("InitProducerId-negative transaction timeout", init_producer_id("sweep-new", -5),
            ErrorCode.INVALID_TRANSACTION_TIMEOUT, "-5 ms"),
    refused("InitProducerId-transaction timeout over the maximum",
            init_producer_id("sweep-new", 2**31 - 1),
            ErrorCode.INVALID_TRANSACTION_TIMEOUT, "2147483647"),
    refused("InitProducerId-two-phase commit without transactional id",
            init_producer_id("", enable_two_phase_commit=True),
            ErrorCode.INVALID_REQUEST, "transactional id"),
    refused("InitProducerId-long transactional id", init_producer_id(LONG_ID),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(LONG_ID)} characters"),
    refused("InitProducerId-2 MB transactional id", init_producer_id(TWO_MB),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(TWO_MB)} characters"),
    refused("AddPartitionsToTxn-no transactional id", add_partitions([(TOPIC, 0)], ""),
            ErrorCode.INVALID_REQUEST, "transactional id"),
    refused("AddPartitionsToTxn-no partitions", add_partitions([]),
            ErrorCode.INVALID_REQUEST, "partitions"),
    refused("AddPartitionsToTxn-empty topic name", add_partitions([("", 0)]),
            ErrorCode.INVALID_REQUEST, "names no topic"),
    refused("AddPartitionsToTxn-negative partition", add_partitions([(TOPIC, -1)]),
            ErrorCode.INVALID_REQUEST, "partition -1", "negative"),
    refused("AddPartitionsToTxn-huge topic name", add_partitions([(HUGE, 0)]),
            ErrorCode.INVALID_REQUEST, "topic name", f"{len(HUGE)} characters"),
    refused("AddPartitionsToTxn-huge transactional id", add_partitions([(TOPIC, 0)], HUGE),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(HUGE)} characters"),
    # Kafka refuses these too: the transaction would hold a partition no
    # marker can reach. With a partition that exists in the same request,
    # nothing of it is added.
    refused("AddPartitionsToTxn-unknown topic",
            add_partitions([(TOPIC, 0), ("sweep-no-such-topic", 0)]),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "sweep-no-such-topic-0", "nothing was added"),
    refused("AddPartitionsToTxn-partition past the topic's count",
            add_partitions([(TOPIC, PARTITIONS)]),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{TOPIC}-{PARTITIONS}"),
    refused("AddOffsetsToTxn-empty group id", add_offsets(""),
            ErrorCode.INVALID_GROUP_ID, "group id"),
    refused("AddOffsetsToTxn-long group id", add_offsets(LONG_ID),
            ErrorCode.INVALID_GROUP_ID, "group_id", f"{len(LONG_ID)} characters"),
    refused("AddOffsetsToTxn-huge transactional id", add_offsets(GROUP, HUGE),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(HUGE)} characters"),
    refused("EndTxn-unknown transactional id", end_txn("no-such-txn"),
            ErrorCode.INVALID_PRODUCER_ID_MAPPING, "'no-such-txn'"),
    refused("EndTxn-huge transactional id", end_txn(HUGE),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(HUGE)} characters"),
    refused("PrepareTransaction-no transactional id", prepare(""),
            ErrorCode.INVALID_REQUEST, "transactional id"),
    refused("PrepareTransaction-huge transactional id", prepare(HUGE),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(HUGE)} characters"),
    refused("CompleteTransaction-no prepared state", complete(TXN_ID, with_state=False),
            ErrorCode.INVALID_REQUEST, "prepared state"),
    refused("CompleteTransaction-huge transactional id", complete(HUGE),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(HUGE)} characters"),
    refused("EndTxn-no transactional id", end_txn(""),
            ErrorCode.INVALID_REQUEST, "EndTxn needs a transactional_id"),
    refused("AddOffsetsToTxn-no transactional id", add_offsets(GROUP, ""),
            ErrorCode.INVALID_REQUEST, "AddOffsetsToTxn needs a transactional_id"),
    refused("AbortTransaction-no transactional id", abort_txn(""),
            ErrorCode.INVALID_REQUEST, "AbortTransaction needs a transactional_id"),
    refused("AbortTransaction-unknown transactional id", abort_txn("sweep-never-seen"),
            ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, "'sweep-never-seen'", "unknown"),
    refused("AbortTransaction-huge transactional id", abort_txn(HUGE),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(HUGE)} characters"),
    refused_item("DescribeTransactions-empty transactional id", describe_txn(""),
                 first_transaction, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, "''"),
    refused_item("DescribeTransactions-long transactional id", describe_txn(LONG_ID),
                 first_transaction, ErrorCode.INVALID_REQUEST, "transactional_id",
                 f"{len(LONG_ID)} characters"),
]


# ---- PartitionStore

def metadata(topic: str) -> Send:
    return lambda s: s.store.Metadata(ps.MetadataRequest(topics=[topic]))


def create_topic(name: str, config: dict[str, str] | None = None) -> Send:
    return lambda s: s.store.CreateTopics(ps.CreateTopicsRequest(topics=[
        ps.TopicSpec(name=name, partitions=1, config=config or {})]))


def delete_topics(*names: str) -> Send:
    return lambda s: s.store.DeleteTopics(ps.DeleteTopicsRequest(names=list(names)))


def create_partitions(*counts: tuple[str, int], validate_only: bool = False) -> Send:
    return lambda s: s.store.CreatePartitions(ps.CreatePartitionsRequest(
        topics=[ps.CreatePartitionsTopic(name=n, count=c) for n, c in counts],
        validate_only=validate_only))


def produce(topic: str, partition: int, data: bytes, *, timeout_ms: int = 0,
            transactional_id: str = "") -> Send:
    return lambda s: s.store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=topic, partition=partition, batch=data)],
        timeout_ms=timeout_ms, transactional_id=transactional_id,
        add_partitions_to_txn=bool(transactional_id)))


def fetch(*partitions: tuple[str, int], isolation: int = records_pb2.READ_UNCOMMITTED,
          max_wait_ms: int = 0, min_bytes: int = 0, partition_max_bytes: int = 0) -> Send:
    return lambda s: s.store.Fetch(ps.FetchRequest(
        partitions=[ps.FetchPartition(topic=t, partition=p, max_bytes=partition_max_bytes)
                    for t, p in partitions],
        isolation_level=records_pb2.IsolationLevel.ValueType(isolation),
        max_wait_ms=max_wait_ms, min_bytes=min_bytes))


def list_offsets(*partitions: tuple[str, int],
                 isolation: int = records_pb2.READ_UNCOMMITTED) -> Send:
    return lambda s: s.store.ListOffsets(ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic=t, partition=p, timestamp_ms=-1)
                    for t, p in partitions],
        isolation_level=records_pb2.IsolationLevel.ValueType(isolation)))


def write_marker(kind: int, *partitions: tuple[str, int]) -> Send:
    return lambda s: s.store.WriteTxnMarkers(ps.WriteTxnMarkersRequest(markers=[ps.TxnMarker(
        producer_id=424242, producer_epoch=1, type=ps.MarkerType.ValueType(kind),
        transactional_id="sweep-marker",
        partitions=[TP(topic=t, partition=p) for t, p in partitions])]))


def describe_producers(topic: str, partition: int) -> Send:
    return lambda s: s.store.DescribeProducers(ps.DescribeProducersRequest(
        partitions=[TP(topic=topic, partition=partition)]))


DATA = encode_batch([(b"k", b"never stored", None, 1_700_000_000_000)],
                    producer_id=424242, producer_epoch=0, base_sequence=0)
TXN_DATA = encode_batch([(b"k", b"never stored", None, 1_700_000_000_000)],
                        producer_id=424242, producer_epoch=0, base_sequence=0,
                        transactional=True)

STORE_CASES = [
    refused_item("Metadata-empty topic name", metadata(""), first_topic,
                 ErrorCode.INVALID_TOPIC_EXCEPTION, "empty"),
    refused_item("Metadata-long topic name", metadata(LONG_TOPIC), first_topic,
                 ErrorCode.INVALID_TOPIC_EXCEPTION, f"{len(LONG_TOPIC)} characters"),
    refused_item("Metadata-illegal character", metadata("bad!topic"), first_topic,
                 ErrorCode.INVALID_TOPIC_EXCEPTION, "'!'"),
    refused_item("Metadata-unknown topic", metadata("no-such-topic"), first_topic,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "'no-such-topic'"),
    refused_item("CreateTopics-an internal topic's name", create_topic("__consumer_offsets"),
                 first_result, ErrorCode.INVALID_TOPIC_EXCEPTION, "__consumer_offsets"),
    refused_item("CreateTopics-max.message.bytes beyond int64",
                 create_topic("sweep-big", {"max.message.bytes": "9" * 20}),
                 first_result, ErrorCode.INVALID_CONFIG, "max.message.bytes"),
    refused("DeleteTopics-no names", delete_topics(), ErrorCode.INVALID_REQUEST, "no topic"),
    refused_item("DeleteTopics-the same topic twice", delete_topics(TOPIC, TOPIC), first_result,
                 ErrorCode.INVALID_REQUEST, f"'{TOPIC}'", "2 times"),
    refused_item("DeleteTopics-empty name", delete_topics(""), first_result,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "''"),
    refused("CreatePartitions-no topics", create_partitions(),
            ErrorCode.INVALID_REQUEST, "names no topic"),
    # Kafka's rules: a topic only grows; none of these changes its count.
    refused_item("CreatePartitions-fewer partitions", create_partitions((TOPIC, 1)),
                 first_result, ErrorCode.INVALID_PARTITIONS,
                 f"'{TOPIC}' has {PARTITIONS} partitions", "1 would not be an increase"),
    refused_item("CreatePartitions-fewer partitions, validate only",
                 create_partitions((TOPIC, 1), validate_only=True),
                 first_result, ErrorCode.INVALID_PARTITIONS, "1 would not be an increase"),
    refused_item("CreatePartitions-the same count", create_partitions((TOPIC, PARTITIONS)),
                 first_result, ErrorCode.INVALID_PARTITIONS,
                 f"already has {PARTITIONS} partitions"),
    refused_item("CreatePartitions-negative count", create_partitions((TOPIC, -1)),
                 first_result, ErrorCode.INVALID_PARTITIONS, "-1 would not be an increase"),
    refused_item("CreatePartitions-over the per-topic limit",
                 create_partitions((TOPIC, limits.MAX_PARTITIONS_PER_TOPIC + 1)),
                 first_result, ErrorCode.INVALID_PARTITIONS,
                 f"got {limits.MAX_PARTITIONS_PER_TOPIC + 1}"),
    refused_item("CreatePartitions-the same topic twice",
                 create_partitions((TOPIC, 3), (TOPIC, 4)), first_result,
                 ErrorCode.INVALID_REQUEST, f"'{TOPIC}'", "2 times"),
    refused_item("CreatePartitions-unknown topic", create_partitions(("no-such-topic", 3)),
                 first_result, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "'no-such-topic'"),
    refused_item("CreatePartitions-empty name", create_partitions(("", 3)), first_result,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "''"),
    *(refused_item(f"CreatePartitions-internal topic {topic}", create_partitions((topic, 9)),
                   first_result, ErrorCode.INVALID_REQUEST, f"{topic!r} is internal")
      for topic in INTERNAL),
    refused("Produce-negative timeout", produce(TOPIC, 0, DATA, timeout_ms=-1),
            ErrorCode.INVALID_REQUEST, "timeout_ms", "-1"),
    refused_item("Produce-empty topic name", produce("", 0, DATA), first_result,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "''"),
    refused_item("Produce-long transactional id",
                 produce(TOPIC, 0, TXN_DATA, transactional_id=LONG_ID), first_result,
                 ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(LONG_ID)} characters"),
    # Only the coordinators write there (they set coordinator_write): a
    # record they cannot read would stop them loading the partition.
    *(refused_item(f"Produce-to internal topic {topic}", produce(topic, 0, DATA), first_result,
                   ErrorCode.INVALID_TOPIC_EXCEPTION, f"{topic!r} is internal")
      for topic in INTERNAL),
    refused("Fetch-unknown isolation level", fetch((TOPIC, 0), isolation=7),
            ErrorCode.INVALID_REQUEST, "isolation level 7"),
    refused("Fetch-negative max_wait_ms", fetch((TOPIC, 0), max_wait_ms=-1),
            ErrorCode.INVALID_REQUEST, "max_wait_ms", "-1"),
    refused("Fetch-negative min_bytes", fetch((TOPIC, 0), min_bytes=-1),
            ErrorCode.INVALID_FETCH_SIZE, "min_bytes (-1)"),
    refused("Fetch-negative partition max_bytes", fetch((TOPIC, 0), partition_max_bytes=-1),
            ErrorCode.INVALID_FETCH_SIZE, f"max_bytes of {TOPIC}-0 is -1"),
    refused("Fetch-the same partition twice", fetch((TOPIC, 0), (TOPIC, 0)),
            ErrorCode.INVALID_REQUEST, f"{TOPIC}-0 more than once"),
    refused_item("Fetch-negative partition", fetch((TOPIC, -1)), first_result,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "partition -1"),
    refused("ListOffsets-no partitions", list_offsets(),
            ErrorCode.INVALID_REQUEST, "no partition"),
    refused("ListOffsets-unknown isolation level", list_offsets((TOPIC, 0), isolation=7),
            ErrorCode.INVALID_REQUEST, "isolation level 7"),
    refused_item("ListOffsets-unknown topic", list_offsets(("no-such-topic", 0)), first_result,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "'no-such-topic'"),
    refused("WriteTxnMarkers-a marker with no partition", write_marker(ps.COMMIT),
            ErrorCode.INVALID_REQUEST, "424242", "no partition"),
    refused_item("WriteTxnMarkers-unknown marker type", write_marker(9, (TOPIC, 0)),
                 first_result, ErrorCode.INVALID_REQUEST, "marker type 9"),
    refused_item("WriteTxnMarkers-negative partition", write_marker(ps.COMMIT, (TOPIC, -1)),
                 first_result, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "partition -1"),
    refused_item("DescribeProducers-negative partition", describe_producers(TOPIC, -1),
                 first_result, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "partition -1"),
    refused_item("DescribeProducers-unknown topic", describe_producers("no-such-topic", 0),
                 first_result, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "'no-such-topic'"),
]


# ---- GroupCoordinator

def join(group_id: str = "sweep-join", *, member_id: str = "", instance_id: str = "",
         topics: list[str] | None = None) -> Send:
    return lambda s: s.groups.ConsumerGroupHeartbeat(gpb.ConsumerGroupHeartbeatRequest(
        group_id=group_id, member_id=member_id, member_epoch=0, group_instance_id=instance_id,
        session_timeout_ms=10_000, subscribed_topics=[TOPIC] if topics is None else topics))


def commit(partitions: list[tuple[str, int, int, str]], *, group_id: str = GROUP,
           member_id: str = "", generation_id: int = -1) -> Send:
    return lambda s: s.groups.OffsetCommit(gpb.OffsetCommitRequest(
        group_id=group_id, generation_id=generation_id, member_id=member_id,
        partitions=[gpb.OffsetCommitPartition(topic=t, partition=p, offset=o, metadata=m)
                    for t, p, o, m in partitions]))


def txn_commit(*, transactional_id: str = TXN_ID, producer_id: int | None = None,
               producer_epoch: int | None = None,
               partitions: tuple[tuple[str, int], ...] = ((TOPIC, 0),),
               metadata: str = "") -> Send:
    return lambda s: s.groups.TxnOffsetCommit(gpb.TxnOffsetCommitRequest(
        transactional_id=transactional_id, group_id=GROUP,
        producer_id=s.producer_id if producer_id is None else producer_id,
        producer_epoch=s.producer_epoch if producer_epoch is None else producer_epoch,
        generation_id=-1,
        partitions=[gpb.OffsetCommitPartition(topic=t, partition=p, offset=9, metadata=metadata)
                    for t, p in partitions]))


def offset_fetch(group_id: str) -> Send:
    return lambda s: s.groups.OffsetFetch(gpb.OffsetFetchRequest(group_id=group_id))


def describe_group(group_id: str) -> Send:
    return lambda s: s.groups.DescribeGroups(gpb.DescribeGroupsRequest(group_ids=[group_id]))


def delete_group(group_id: str) -> Send:
    return lambda s: s.groups.DeleteGroups(gpb.DeleteGroupsRequest(group_ids=[group_id]))


def classic_join(group_id: str = "sweep-classic", *, member_id: str = "",
                 instance_id: str = "", session_timeout_ms: int = 10_000,
                 protocol_type: str = "consumer", protocol_name: str = "range") -> Send:
    return lambda s: s.groups.JoinGroup(gpb.JoinGroupRequest(
        group_id=group_id, member_id=member_id, group_instance_id=instance_id,
        session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=10_000,
        protocol_type=protocol_type,
        protocols=[gpb.JoinGroupProtocol(name=protocol_name, metadata=b"m")]))


def classic_sync(group_id: str = "sweep-classic", *, member_id: str = "m",
                 assigned_to: str = "m") -> Send:
    return lambda s: s.groups.SyncGroup(gpb.SyncGroupRequest(
        group_id=group_id, member_id=member_id, generation_id=1,
        assignments=[gpb.SyncGroupAssignment(member_id=assigned_to, assignment=b"a")]))


def classic_heartbeat(group_id: str = "sweep-classic", *, member_id: str = "m") -> Send:
    return lambda s: s.groups.ClassicHeartbeat(gpb.ClassicHeartbeatRequest(
        group_id=group_id, member_id=member_id, generation_id=1))


def leave(group_id: str = "sweep-classic", *, member_id: str = "m") -> Send:
    return lambda s: s.groups.LeaveGroup(gpb.LeaveGroupRequest(
        group_id=group_id, members=[gpb.LeaveGroupMember(member_id=member_id)]))


def answer_error(response: Any) -> errors_pb2.Error:
    return response.error


def first_member(response: Any) -> errors_pb2.Error:
    return response.members[0].error


# More subscribed topics (of names as long as may be) than a group record holds.
MANY_TOPICS = [f"{i:05d}-" + "s" * (limits.MAX_TOPIC_NAME_LENGTH - 6) for i in range(5000)]
FULL_METADATA = "d" * 4096

GROUP_CASES = [
    refused("ConsumerGroupHeartbeat-empty group id", join(""),
            ErrorCode.INVALID_GROUP_ID, "group_id"),
    refused("ConsumerGroupHeartbeat-long group id", join(LONG_ID),
            ErrorCode.INVALID_GROUP_ID, "group_id", f"{len(LONG_ID)} characters"),
    refused("ConsumerGroupHeartbeat-long member id", join(member_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "member_id", f"{len(LONG_ID)} characters"),
    refused("ConsumerGroupHeartbeat-2 MB member id", join(member_id=TWO_MB),
            ErrorCode.INVALID_REQUEST, "member_id", f"{len(TWO_MB)} characters"),
    refused("ConsumerGroupHeartbeat-long group instance id", join(instance_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "group_instance_id", f"{len(LONG_ID)} characters"),
    refused("ConsumerGroupHeartbeat-long subscribed topic name",
            join(topics=[TOPIC, LONG_TOPIC]),
            ErrorCode.INVALID_TOPIC_EXCEPTION, "subscribed_topics",
            f"{len(LONG_TOPIC)} characters"),
    refused("ConsumerGroupHeartbeat-more subscribed topics than a group record holds",
            join(topics=MANY_TOPICS),
            ErrorCode.MESSAGE_TOO_LARGE, "'sweep-join'", f"{len(MANY_TOPICS)} subscribed topics"),
    refused("OffsetCommit-no partitions", commit([]),
            ErrorCode.INVALID_REQUEST, "no partition"),
    refused("OffsetCommit-the same partition twice",
            commit([(TOPIC, 0, 1, ""), (TOPIC, 0, 2, "")]),
            ErrorCode.INVALID_REQUEST, f"{TOPIC}-0 appears twice"),
    refused("OffsetCommit-metadata over 4 KiB", commit([(TOPIC, 0, 1, "x" * 4097)]),
            ErrorCode.OFFSET_METADATA_TOO_LARGE, f"{TOPIC}-0", "metadata is 4097 bytes",
            "4096-byte limit"),
    refused("OffsetCommit-negative partition", commit([(TOPIC, -1, 1, "")]),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{TOPIC}--1"),
    refused("OffsetCommit-empty topic name", commit([("", 0, 1, "")]),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "empty name"),
    refused("OffsetCommit-huge topic name", commit([(HUGE, 0, 1, "")]),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{len(HUGE)} characters"),
    refused("OffsetCommit-long group id", commit([(TOPIC, 0, 1, "")], group_id=LONG_ID),
            ErrorCode.INVALID_GROUP_ID, "group_id", f"{len(LONG_ID)} characters"),
    refused("OffsetCommit-huge member id",
            commit([(TOPIC, 0, 1, "")], member_id=HUGE, generation_id=1),
            ErrorCode.INVALID_REQUEST, "member_id", f"{len(HUGE)} characters"),
    refused("OffsetCommit-more offsets than one batch holds",
            commit([(WIDE, p, 1, FULL_METADATA) for p in range(WIDE_PARTITIONS)]),
            ErrorCode.INVALID_COMMIT_OFFSET_SIZE, f"'{GROUP}'", f"{WIDE_PARTITIONS} partitions"),
    refused("OffsetFetch-empty group id", offset_fetch(""),
            ErrorCode.INVALID_GROUP_ID, "group_id"),
    refused("OffsetFetch-long group id", offset_fetch(LONG_ID),
            ErrorCode.INVALID_GROUP_ID, "group_id", f"{len(LONG_ID)} characters"),
    refused("TxnOffsetCommit-no transactional id", txn_commit(transactional_id=""),
            ErrorCode.INVALID_REQUEST, "transactional_id"),
    refused("TxnOffsetCommit-long transactional id", txn_commit(transactional_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "transactional_id", f"{len(LONG_ID)} characters"),
    refused("TxnOffsetCommit-negative producer id", txn_commit(producer_id=-1),
            ErrorCode.INVALID_REQUEST, "producer_id is -1"),
    refused("TxnOffsetCommit-negative producer epoch", txn_commit(producer_epoch=-1),
            ErrorCode.INVALID_REQUEST, "producer_epoch is -1"),
    refused("TxnOffsetCommit-producer epoch beyond int16", txn_commit(producer_epoch=40_000),
            ErrorCode.INVALID_REQUEST, "producer_epoch is 40000"),
    refused("TxnOffsetCommit-no partitions", txn_commit(partitions=()),
            ErrorCode.INVALID_REQUEST, "no partition"),
    refused("TxnOffsetCommit-metadata over 4 KiB", txn_commit(metadata="x" * 5000),
            ErrorCode.OFFSET_METADATA_TOO_LARGE, f"{TOPIC}-0", "metadata is 5000 bytes"),
    # The group coordinator's write adds the offsets partition to the
    # producer's transaction (as a data write with add_partitions_to_txn
    # does), so a producer id the transactional id does not have is refused
    # by the coordinator, an old epoch by the store, and nothing is added or
    # written.
    refused("TxnOffsetCommit-another producer's id", txn_commit(producer_id=4242),
            ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"'{TXN_ID}'"),
    refused("TxnOffsetCommit-an old epoch", txn_commit(producer_epoch=0),
            ErrorCode.PRODUCER_FENCED, "epoch 0 is below the current epoch 1"),
    refused_item("DescribeGroups-unknown group", describe_group("no-such-group"), first_group,
                 ErrorCode.GROUP_ID_NOT_FOUND, "'no-such-group'"),
    refused_item("DescribeGroups-empty group id", describe_group(""), first_group,
                 ErrorCode.INVALID_GROUP_ID, "group_id"),
    refused_item("DescribeGroups-long group id", describe_group(LONG_ID), first_group,
                 ErrorCode.INVALID_GROUP_ID, "group_id", f"{len(LONG_ID)} characters"),
    refused_item("DeleteGroups-unknown group", delete_group("no-such-group"), first_result,
                 ErrorCode.GROUP_ID_NOT_FOUND, "'no-such-group'"),
    refused_item("DeleteGroups-empty group id", delete_group(""), first_result,
                 ErrorCode.INVALID_GROUP_ID, "group_id"),
    refused_item("DeleteGroups-long group id", delete_group(LONG_ID), first_result,
                 ErrorCode.INVALID_GROUP_ID, "group_id", f"{len(LONG_ID)} characters"),
    # Kafka's classic group protocol: bad input is a status; the protocol's
    # own refusals are the answer's `error` (they come with other fields).
    refused("JoinGroup-empty group id", classic_join(""), ErrorCode.INVALID_GROUP_ID,
            "group_id"),
    refused("JoinGroup-long group id", classic_join(LONG_ID), ErrorCode.INVALID_GROUP_ID,
            "group_id", f"{len(LONG_ID)} characters"),
    refused("JoinGroup-2 MB member id", classic_join(member_id=TWO_MB),
            ErrorCode.INVALID_REQUEST, "member_id", f"{len(TWO_MB)} characters"),
    refused("JoinGroup-long group instance id", classic_join(instance_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "group_instance_id", f"{len(LONG_ID)} characters"),
    refused("JoinGroup-session timeout below the range", classic_join(session_timeout_ms=5),
            ErrorCode.INVALID_SESSION_TIMEOUT, "session_timeout_ms 5"),
    refused("JoinGroup-huge protocol name", classic_join(protocol_name=HUGE),
            ErrorCode.INVALID_REQUEST, "protocols[].name", f"{len(HUGE)} characters"),
    refused("JoinGroup-huge protocol type", classic_join(protocol_type=HUGE),
            ErrorCode.INVALID_REQUEST, "protocol_type", f"{len(HUGE)} characters"),
    refused_item("JoinGroup-no protocol type", classic_join(protocol_type=""), answer_error,
                 ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "'sweep-classic'", "protocol type"),
    refused_item("JoinGroup-unknown member of an unknown group",
                 classic_join(member_id="ghost"), answer_error,
                 ErrorCode.UNKNOWN_MEMBER_ID, "'sweep-classic'", "'ghost'"),
    refused("SyncGroup-empty group id", classic_sync(""), ErrorCode.INVALID_GROUP_ID,
            "group_id"),
    refused("SyncGroup-long member id", classic_sync(member_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "member_id", f"{len(LONG_ID)} characters"),
    refused("SyncGroup-long member id in an assignment", classic_sync(assigned_to=HUGE),
            ErrorCode.INVALID_REQUEST, "assignments[].member_id", f"{len(HUGE)} characters"),
    refused_item("SyncGroup-unknown group", classic_sync(), answer_error,
                 ErrorCode.UNKNOWN_MEMBER_ID, "'sweep-classic'", "'m'"),
    refused("ClassicHeartbeat-empty group id", classic_heartbeat(""),
            ErrorCode.INVALID_GROUP_ID, "group_id"),
    refused("ClassicHeartbeat-long member id", classic_heartbeat(member_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "member_id", f"{len(LONG_ID)} characters"),
    refused_item("ClassicHeartbeat-unknown member", classic_heartbeat(), answer_error,
                 ErrorCode.UNKNOWN_MEMBER_ID, "'sweep-classic'", "'m'"),
    refused("LeaveGroup-empty group id", leave(""), ErrorCode.INVALID_GROUP_ID, "group_id"),
    refused("LeaveGroup-long member id", leave(member_id=LONG_ID),
            ErrorCode.INVALID_REQUEST, "members[].member_id", f"{len(LONG_ID)} characters"),
    refused_item("LeaveGroup-unknown member", leave(), first_member,
                 ErrorCode.UNKNOWN_MEMBER_ID, "'sweep-classic'", "'m'"),
    # A group with committed offsets alone has no classic member.
    refused_item("SyncGroup-to the setup's group", classic_sync(GROUP), answer_error,
                 ErrorCode.UNKNOWN_MEMBER_ID, f"'{GROUP}'"),
]

CASES = COORDINATOR_CASES + STORE_CASES + GROUP_CASES


def _refusal(s: Sweep, case: Case) -> errors_pb2.Error:
    if case.item is not None:
        return case.item(case.send(s))
    with pytest.raises(grpc.RpcError) as info:
        case.send(s)
    exc: Any = info.value
    status, details = exc.code(), exc.details()
    assert status not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (status, details)
    trailers = {key for key, _value in exc.trailing_metadata() or ()}
    assert STATUS_DETAILS_KEY in trailers, f"no oncelog.v1.Error in the status: {status} {details}"
    error = error_from_rpc(exc)
    assert details == f"{ErrorCode.from_wire(error.code).name}: {error.message}"
    return error


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(
    sweep: tuple[Sweep, dict[str, object]], case: Case
) -> None:
    s, _stored = sweep
    # Compared with the state just before this case, so that a case that
    # changes something fails alone (not every case after it too);
    # test_what_the_setup_stored_is_unchanged compares with the setup's.
    before = observe(s)
    error = _refusal(s, case)
    after = observe(s)
    assert ErrorCode.from_wire(error.code) is case.code, error
    assert not error.retriable, error
    for name in case.names:
        assert name in error.message, (name, error.message[:500])
    assert after == before


def test_what_the_setup_stored_is_unchanged(sweep: tuple[Sweep, dict[str, object]]) -> None:
    """Runs after every case (pytest keeps a module's order): nothing that a
    bad request set off changed the stored state later either."""
    s, stored = sweep
    assert observe(s) == stored


def test_a_topic_created_after_a_refused_add_can_be_added(
    sweep: tuple[Sweep, dict[str, object]]
) -> None:
    """The coordinator caches partition counts; a topic it was told does not
    exist must be added once it does (the miss is read again)."""
    s, _stored = sweep
    late_topic, tid = "sweep-late", "sweep-late-tx"
    init = retrying(lambda: s.txn.InitProducerId(cpb.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1,
        producer_epoch=-1)))
    request = cpb.AddPartitionsToTxnRequest(
        transactional_id=tid, producer_id=init.producer_id,
        producer_epoch=init.producer_epoch, partitions=[TP(topic=late_topic, partition=0)])
    with pytest.raises(grpc.RpcError) as info:
        s.txn.AddPartitionsToTxn(request)
    error = error_from_rpc(info.value)
    assert ErrorCode.from_wire(error.code) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error
    with Admin(bootstrap=s.cluster.bootstrap) as admin:
        admin.create_topic(late_topic, partitions=1)
    s.txn.AddPartitionsToTxn(request)
    [described] = s.txn.DescribeTransactions(
        cpb.DescribeTransactionsRequest(transactional_ids=[tid])).transactions
    assert (described.state, [(p.topic, p.partition) for p in described.partitions]) == (
        "Ongoing", [(late_topic, 0)])


def test_a_producer_cannot_write_to_internal_topics(
    sweep: tuple[Sweep, dict[str, object]]
) -> None:
    """Through the SDK, as a user would by mistake: the record fails with
    the store's refusal and both coordinators go on working."""
    s, _stored = sweep
    with Producer(bootstrap=s.cluster.bootstrap) as producer:
        for topic in INTERNAL:
            future = producer.send(topic, key=b"user-key", value=b"user value", partition=0)
            with pytest.raises(errors.InvalidTopicError, match="internal"):
                future.result(timeout=30)
    with Producer(bootstrap=s.cluster.bootstrap, transactional_id="sweep-after-internal") as tx:
        tx.init_transactions()
        tx.begin_transaction()
        tx.send(TOPIC, value=b"after", partition=0)
        tx.send_offsets_to_transaction(
            {TopicPartition(TOPIC, 0): 1},
            GroupMetadata(group_id="sweep-after-internal", generation_id=-1, member_id=""),
        )
        tx.commit_transaction()
