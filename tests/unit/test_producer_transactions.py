"""The transactional producer against the real coordinator and store, with
scripted faults.

Goal: a partition joins the transaction before its first transactional batch,
added by the store on the producer's behalf (no AddPartitionsToTxn from the
client, one add per partition and transaction); a commit whose answer is lost is retried with
the same producer id and epoch and commits exactly once; CONCURRENT_TRANSACTIONS
is retried; fencing and the other fatal errors end the producer for good; an
abortable error is recovered by abort_transaction(), after which the producer
uses EndTxn's new epoch with sequences from 0; abort_transaction() drops what
was not sent, and so does a transaction that broke (TransactionAbortedError
on the dropped records' futures); offsets join a transaction; read_committed end offsets are the
last stable offset.

Method: tests/support/inprocess_cluster.InProcessCluster runs the real store,
transaction coordinator and (where a test needs one) group coordinator in
this process; its coordinator and produce fault plans inject lost replies
and error answers (the coordinator plan also reaches the store's own
AddPartitionsToTxn calls); the log (with its markers) is read back through
the store's fetch and compared with what each transaction sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from oncelog import Consumer, GroupMetadata, Producer, TopicPartition, errors
from oncelog import records as codec
from oncelog.errors import ErrorCode
from services.coordinator.core.transactions import TxnState
from tests.support.inprocess_cluster import DROP_REPLY, BatchView, InProcessCluster

TID = "tx-1"


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    # No group coordinator (test_offsets_without_a_group_coordinator_fail_clearly);
    # timeouts are checked often (test_a_transaction_timed_out_by_the_coordinator...).
    with InProcessCluster(group_coordinator=False, transaction_check_interval_ms=20) as s:
        s.create_topic("t", 4)
        yield s


def txn_producer(store: InProcessCluster, **options: Any) -> Producer:
    options.setdefault("linger_ms", 1)
    options.setdefault("retry_backoff_ms", 10)
    return Producer(bootstrap=store.address, transactional_id=TID, **options)


def send_all(producer: Producer, tag: bytes, partitions: int = 4, per_partition: int = 20
             ) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for i in range(per_partition):
        for p in range(partitions):
            value = b"%s-%d-%d" % (tag, p, i)
            sent[p].append(value)
            producer.send("t", value=value, partition=p)
    return sent


def markers(store: InProcessCluster, partition: int) -> list[tuple[int, int]]:
    """(marker type, producer epoch) of the partition's control batches."""
    return store.markers("t", partition)


def test_the_store_adds_partitions_to_the_transaction(store: InProcessCluster) -> None:
    with txn_producer(store, linger_ms=5) as producer:
        producer.init_transactions()
        sent = []
        for round_no in range(2):
            producer.begin_transaction()
            sent.append(send_all(producer, b"r%d" % round_no, per_partition=50))
            producer.commit_transaction()
    # Every transactional Produce asked the store to add its partitions, and
    # the coordinator was asked once per partition and transaction (the store
    # refuses a transactional batch on a partition not in the transaction;
    # an add by the client itself would have asked a second time).
    produces = [r for r in store.calls_named("Produce") if r.transactional_id]
    assert produces and all(r.add_partitions_to_txn for r in produces)
    adds = [(r.producer_epoch, tp.partition)
            for r in store.calls_named("AddPartitionsToTxn") for tp in r.partitions]
    assert len(adds) == len(set(adds)) == 8
    for p in range(4):
        assert store.committed_values("t", p) == sent[0][p] + sent[1][p]


def test_a_commit_whose_answer_is_lost_is_retried_and_commits_once(store: InProcessCluster) -> None:
    lost = threading.Event()

    def lose_first_end(name: str, _request: object) -> str | None:
        if name == "EndTxn" and not lost.is_set():
            lost.set()
            return DROP_REPLY
        return None

    store.coordinator_fault = lose_first_end
    with txn_producer(store) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        producer.begin_transaction()
        sent = send_all(producer, b"a")
        producer.commit_transaction()
        ends = store.calls_named("EndTxn")
        assert len(ends) == 2 and all(e.commit for e in ends)
        assert {(e.producer_id, e.producer_epoch) for e in ends} == {
            (producer.producer_id, epoch)}
        assert producer.producer_epoch == epoch + 1
        # The next transaction uses the new epoch.
        producer.begin_transaction()
        producer.send("t", value=b"next", partition=0)
        producer.commit_transaction()
    for p in range(4):
        expected = sent[p] + ([b"next"] if p == 0 else [])
        assert store.committed_values("t", p) == expected
        # Exactly one COMMIT marker for the first transaction.
        assert markers(store, p)[0] == (codec.MARKER_COMMIT, epoch + 1)
        assert [m for m in markers(store, p) if m[1] == epoch + 1] == [
            (codec.MARKER_COMMIT, epoch + 1)]


def test_concurrent_transactions_is_retried(store: InProcessCluster) -> None:
    answered: dict[str, int] = {}

    def busy(name: str, _request: object) -> ErrorCode | None:
        if name in ("InitProducerId", "AddPartitionsToTxn", "EndTxn"):
            answered[name] = answered.get(name, 0) + 1
            if answered[name] <= 3:
                return ErrorCode.CONCURRENT_TRANSACTIONS
        return None

    store.coordinator_fault = busy
    with txn_producer(store) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        sent = send_all(producer, b"c", partitions=2)
        producer.commit_transaction()
    # The refused batches were retried, and the store added each of the two
    # partitions once it was let through (both in one call when one request
    # carried both).
    assert (answered["InitProducerId"], answered["EndTxn"]) == (4, 4)
    adds = store.calls_named("AddPartitionsToTxn")
    assert sorted(tp.partition for add in adds[3:] for tp in add.partitions) == [0, 1]
    for p in range(2):
        assert store.committed_values("t", p) == sent[p]


def test_coordinator_moves_are_followed(store: InProcessCluster) -> None:
    count = {"n": 0}

    def moving(name: str, _request: object) -> ErrorCode | None:
        # The store's adds see the moves too; the producer retries those batches.
        if name == "AddPartitionsToTxn" and count["n"] < 2:
            count["n"] += 1
            return ErrorCode.NOT_COORDINATOR
        if name == "EndTxn" and count["n"] < 6:
            count["n"] += 1
            return [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS][
                count["n"] % 2]
        return None

    store.coordinator_fault = moving
    with txn_producer(store) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        sent = send_all(producer, b"m", partitions=1)
        producer.commit_transaction()
    assert store.committed_values("t", 0) == sent[0]
    # Every move of EndTxn's coordinator made the producer ask FindCoordinator again.
    assert len(store.calls_named("FindCoordinator")) >= 1 + 4


@pytest.mark.parametrize("code", [
    ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING, ErrorCode.TRANSACTION_COORDINATOR_FENCED,
])
def test_fatal_coordinator_errors_end_the_producer(store: InProcessCluster,
                                                   code: ErrorCode) -> None:
    store.coordinator_fault = lambda name, _r: code if name == "AddPartitionsToTxn" else None
    producer = txn_producer(store)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        fut = producer.send("t", value=b"x", partition=0)
        exc = fut.exception(timeout=30)
        cls = type(errors.error_for(code))
        assert isinstance(exc, cls)
        store.coordinator_fault = None
        # Every later call raises the same fatal error.
        for call in (producer.commit_transaction, producer.abort_transaction,
                     producer.begin_transaction, producer.init_transactions,
                     lambda: producer.send("t", value=b"y", partition=1)):
            with pytest.raises(cls):
                call()
        assert producer.transaction_state == "fatal_error"
    finally:
        producer.close()
    assert store.data_values("t", 0) == []


def test_an_unexpected_out_of_order_in_a_transaction_is_fatal(store: InProcessCluster) -> None:
    store.fault = lambda view: ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    with txn_producer(store) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        exc = producer.send("t", value=b"x", partition=0).exception(timeout=30)
        assert isinstance(exc, errors.OutOfOrderSequenceNumberError)
        with pytest.raises(errors.OutOfOrderSequenceNumberError):
            producer.commit_transaction()
        assert producer.transaction_state == "fatal_error"


def test_a_new_instance_fences_the_old_one(store: InProcessCluster) -> None:
    old = txn_producer(store)
    try:
        old.init_transactions()
        old.begin_transaction()
        old.send("t", value=b"zombie", partition=0)
        old.flush()
        with txn_producer(store) as new:
            new.init_transactions()
            assert new.producer_epoch > old.producer_epoch
            # The old instance's write to an added partition is refused by the
            # store (its epoch is below the abort marker's) ...
            exc = old.send("t", value=b"zombie-2", partition=0).exception(timeout=30)
            assert isinstance(exc, errors.ProducerFencedError)
            with pytest.raises(errors.ProducerFencedError):
                old.commit_transaction()
            new.begin_transaction()
            new.send("t", value=b"new", partition=0)
            new.commit_transaction()
    finally:
        old.close()
    assert store.committed_values("t", 0) == [b"new"]


def test_a_transaction_timed_out_by_the_coordinator_fences_its_producer(
        store: InProcessCluster) -> None:
    with txn_producer(store, transaction_timeout_ms=300) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"late", partition=0)
        producer.flush()
        # The coordinator's timer aborts the transaction with an epoch bump.
        deadline = time.monotonic() + 30
        while (txn := store.transaction(TID)) is None or txn.state is not TxnState.COMPLETE_ABORT:
            assert time.monotonic() < deadline, txn
            time.sleep(0.01)
        # A partition not added yet: AddPartitionsToTxn is fenced.
        exc = producer.send("t", value=b"late-2", partition=1).exception(timeout=30)
        assert isinstance(exc, errors.ProducerFencedError)
        with pytest.raises(errors.ProducerFencedError):
            producer.commit_transaction()
    assert store.committed_values("t", 0) == []
    assert store.data_values("t", 0) == [b"late"]


@pytest.mark.parametrize("code", [
    ErrorCode.CORRUPT_MESSAGE, ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.INVALID_TXN_STATE,
])
def test_abortable_error_then_abort_then_the_next_transaction_works(store: InProcessCluster,
                                                                    code: ErrorCode) -> None:
    failed_once = threading.Event()

    def fail_one(view: BatchView) -> ErrorCode | None:
        if view.partition == 2 and not failed_once.is_set():
            failed_once.set()
            return code
        return None

    store.fault = fail_one
    with txn_producer(store) as producer:
        producer.init_transactions()
        first_epoch = producer.producer_epoch
        producer.begin_transaction()
        send_all(producer, b"doomed")
        with pytest.raises(errors.TransactionAbortableError) as raised:
            producer.commit_transaction()
        assert isinstance(raised.value.__cause__, type(errors.error_for(code)))
        assert producer.transaction_state == "abortable_error"
        producer.abort_transaction()
        assert producer.producer_epoch == first_epoch + 1
        assert producer.transaction_state == "ready"

        producer.begin_transaction()
        sent = send_all(producer, b"good")
        producer.commit_transaction()
    for p in range(4):
        assert store.committed_values("t", p) == sent[p]
        # The new transaction restarted every partition at sequence 0 under
        # the epoch EndTxn(abort) handed out.
        good = [h for h in store.headers("t", p)
                if not h.is_control and h.producer_epoch == first_epoch + 1]
        assert good and good[0].base_sequence == 0


def test_abort_drops_records_not_yet_sent(store: InProcessCluster) -> None:
    with txn_producer(store, linger_ms=60_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send("t", value=b"v%d" % i, partition=i % 4) for i in range(40)]
        producer.abort_transaction()
        for fut in futures:
            exc = fut.exception(timeout=30)
            assert isinstance(exc, errors.TransactionAbortedError)
            # Handlers of TransactionAbortableError still catch it.
            assert isinstance(exc, errors.TransactionAbortableError)
            assert "aborted" in str(exc)
        producer.begin_transaction()
        producer.send("t", value=b"kept", partition=0)
        producer.commit_transaction()
    assert [store.data_values("t", p) for p in range(4)] == [[b"kept"], [], [], []]
    # The abort reached the coordinator only if a partition had been added.
    ends = store.calls_named("EndTxn")
    assert [e.commit for e in ends][-1] is True


def test_records_queued_when_the_transaction_broke_fail_as_aborted(store: InProcessCluster) -> None:
    def corrupt_p1(view: BatchView) -> ErrorCode | None:
        return ErrorCode.CORRUPT_MESSAGE if view.partition == 1 else None

    store.fault = corrupt_p1
    with txn_producer(store, linger_ms=60_000, batch_size=200) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        lingering = producer.send("t", value=b"small", partition=0)
        # A record over batch_size goes out at once, and fails.
        failing = producer.send("t", value=b"x" * 300, partition=1)
        assert isinstance(failing.exception(timeout=30), errors.CorruptRecordError)
        exc = lingering.exception(timeout=30)
        assert isinstance(exc, errors.TransactionAbortedError)
        assert isinstance(exc.__cause__, errors.CorruptRecordError)
        assert "must be aborted" in str(exc)
        producer.abort_transaction()
    assert store.data_values("t", 0) == []


def test_abort_waits_for_batches_in_flight(store: InProcessCluster) -> None:
    release = threading.Event()
    in_produce = threading.Event()

    def slow(view: BatchView) -> None:
        in_produce.set()
        assert release.wait(30)

    store.fault = slow
    with txn_producer(store) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fut = producer.send("t", value=b"in-flight", partition=0)
        assert in_produce.wait(30)
        aborting = threading.Thread(target=producer.abort_transaction)
        aborting.start()
        aborting.join(0.2)
        assert aborting.is_alive(), "abort must wait for the batch in flight"
        store.fault = None
        release.set()
        aborting.join(30)
        assert fut.result(timeout=30).offset == 0  # written, then aborted
    assert store.data_values("t", 0) == [b"in-flight"]
    assert store.committed_values("t", 0) == []
    assert markers(store, 0) == [(codec.MARKER_ABORT, 1)]


def test_offsets_join_the_transaction() -> None:
    with InProcessCluster() as store:
        store.create_topic("t", 1)
        store.create_topic("in", 1)
        source = TopicPartition("in", 0)
        # A real member of the group, owning the partition whose offsets commit.
        with Consumer(bootstrap=store.address, group_id="copier",
                      fetch_max_wait_ms=20) as member, txn_producer(store) as producer:
            member.subscribe(["in"])
            deadline = time.monotonic() + 30
            while not any(source.partition in [p.partition for p in hb.owned_partitions]
                          for hb in store.calls_named("ConsumerGroupHeartbeat")):
                assert time.monotonic() < deadline, "the member never owned in-0"
                member.poll(timeout=0.02)
            group = member.group_metadata()
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("t", value=b"out", partition=0)
            producer.send_offsets_to_transaction({source: 43}, group)
            assert store.committed_offsets("copier", stable=False) == {}
            producer.commit_transaction()
            assert store.committed_offsets("copier") == {("in", 0): 43}
            producer.begin_transaction()
            producer.send_offsets_to_transaction({source: 99}, group)
            producer.abort_transaction()
            assert store.committed_offsets("copier") == {("in", 0): 43}
            # Offsets alone: the group coordinator's write starts the
            # transaction at the coordinator, and the commit makes them the
            # group's (its marker reached the offsets partition).
            epoch = producer.producer_epoch
            producer.begin_transaction()
            producer.send_offsets_to_transaction({source: 120}, group)
            producer.commit_transaction()
            assert store.committed_offsets("copier") == {("in", 0): 120}
            assert producer.producer_epoch == epoch + 1
        # The offsets partition joined each transaction with the write of the
        # offsets: the producer sent no AddOffsetsToTxn.
        assert store.calls_named("AddOffsetsToTxn") == []
        commits = store.calls_named("TxnOffsetCommit")
        assert [(c.generation_id, c.member_id) for c in commits] == [
            (group.generation_id, group.member_id)] * 3


def test_offsets_without_a_group_coordinator_fail_clearly(store: InProcessCluster) -> None:
    with txn_producer(store) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"out", partition=0)
        with pytest.raises(errors.CoordinatorNotAvailableError, match="no group coordinator"):
            producer.send_offsets_to_transaction({TopicPartition("in", 0): 1},
                                                 GroupMetadata("g", 1, "m"))
        # Nothing reached the coordinator: the transaction can still commit.
        producer.commit_transaction()
    assert store.committed_values("t", 0) == [b"out"]
    assert store.calls_named("AddOffsetsToTxn") == []


def test_close_aborts_an_open_transaction(store: InProcessCluster) -> None:
    producer = txn_producer(store)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", value=b"x", partition=0).result(timeout=30)
    producer.close()
    txn = store.transaction(TID)
    assert txn is not None and txn.state is TxnState.COMPLETE_ABORT
    assert store.committed_values("t", 0) == []


def test_read_committed_end_offsets_are_the_last_stable_offset(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address) as plain:
        for i in range(3):
            plain.send("t", value=b"p%d" % i, partition=0)
    with txn_producer(store) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"open", partition=0).result(timeout=30)
        tp = TopicPartition("t", 0)
        with Consumer(bootstrap=store.address) as committed, \
                Consumer(bootstrap=store.address, isolation_level="read_uncommitted") as dirty:
            assert committed.end_offsets([tp]) == {tp: 3}
            assert dirty.end_offsets([tp]) == {tp: 4}
            producer.commit_transaction()
            store.settle()  # the marker is written after EndTxn's answer
            assert committed.end_offsets([tp]) == {tp: 5}  # data + marker
