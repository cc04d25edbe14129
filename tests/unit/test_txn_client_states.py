"""The transactional producer's state table, as data and as behaviour.

Goal: every call of a transactional producer, in every state, does what the
one table in `oncelog._transactions` says: allowed calls work, calls that a
broken transaction or a fenced producer refuse raise that error, and every
other call raises IllegalStateError naming the state; and no transition
happens that the table does not list.

Method: the pure table walked pair by pair; then a real Producer (with
two-phase commit enabled) against tests/support/inprocess_cluster.InProcessCluster
(the real store and coordinators in this process, with scripted faults in
front of them) driven into each of the eleven states, and each of the eight
calls tried on a fresh producer in that state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from oncelog import GroupMetadata, PreparedTxnState, Producer, TopicPartition, errors
from oncelog._transactions import TABLE, Op, ProducerTxnState, TxnStateMachine
from oncelog.errors import ErrorCode
from tests.support.inprocess_cluster import UNREACHABLE, BatchView, InProcessCluster

_tid_counter = itertools.count()


# ------------------------------------------------------------------ the table


def test_every_transition_pair_is_checked_against_the_table() -> None:
    for source, target in itertools.product(ProducerTxnState, ProducerTxnState):
        sm = TxnStateMachine("t")
        sm.state = source
        if target is source or target in TABLE[source].leads_to:
            sm.transition_to(target, errors.error_for(ErrorCode.PRODUCER_FENCED, "x"))
            assert sm.state is target
        else:
            with pytest.raises(RuntimeError, match="illegal transition"):
                sm.transition_to(target)
            assert sm.state is source


def test_every_call_in_every_state_is_allowed_or_refused_by_the_table() -> None:
    fenced = errors.error_for(ErrorCode.PRODUCER_FENCED, "fenced by epoch 3")
    broken = errors.error_for(ErrorCode.CORRUPT_MESSAGE, "bad batch")
    for state, op in itertools.product(ProducerTxnState, Op):
        sm = TxnStateMachine("tx-a")
        sm.state = state
        sm.error = fenced if state is ProducerTxnState.FATAL_ERROR else broken
        refusal = sm.refusal(op)
        row = TABLE[state]
        if op in row.accepts:
            assert refusal is None, (state, op)
        elif op in row.raises_error:
            if state is ProducerTxnState.FATAL_ERROR:
                assert isinstance(refusal, errors.ProducerFencedError), (state, op)
                assert refusal.__cause__ is fenced
            else:
                assert isinstance(refusal, errors.TransactionAbortableError), (state, op)
                assert "bad batch" in str(refusal) and "abort_transaction" in str(refusal)
        else:
            assert isinstance(refusal, errors.IllegalStateError), (state, op)
            assert state.value in str(refusal) and op.value in str(refusal)


def test_the_table_is_complete_and_fatal_is_final() -> None:
    assert set(TABLE) == set(ProducerTxnState)
    assert TABLE[ProducerTxnState.FATAL_ERROR].leads_to == frozenset()
    assert TABLE[ProducerTxnState.FATAL_ERROR].raises_error == frozenset(Op)
    for state in ProducerTxnState:
        if state is not ProducerTxnState.FATAL_ERROR:
            assert ProducerTxnState.FATAL_ERROR in TABLE[state].leads_to, state


# ------------------------------------------------------ the producer, per state


@pytest.fixture(scope="module")
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster() as s:
        s.create_topic("t", 2)
        yield s


def _producer(store: InProcessCluster) -> Producer:
    return Producer(bootstrap=store.address, transactional_id=f"tx-{next(_tid_counter)}",
                    linger_ms=1, retry_backoff_ms=10, max_block_ms=10_000,
                    transaction_two_phase_commit_enable=True)


# The prepared state each producer last prepared: what complete_transaction()
# is called with (in `ready`, a completed one: a repeated completion).
_prepared: dict[int, PreparedTxnState] = {}


def _prepare(p: Producer) -> None:
    p.send("t", value=b"x", partition=0)
    _prepared[id(p)] = p.prepare_transaction()


def _unreachable(call: str) -> Callable[[str, object], str | None]:
    return lambda name, _r: UNREACHABLE if name == call else None


def _in_state(store: InProcessCluster, state: ProducerTxnState) -> Producer:
    """A fresh producer driven into `state`; the store's faults are cleared."""
    store.fault = None
    store.coordinator_fault = None
    p = _producer(store)
    if state is ProducerTxnState.UNINITIALIZED:
        return p
    if state is ProducerTxnState.INITIALIZING:
        store.coordinator_fault = lambda name, _r: UNREACHABLE if name == "InitProducerId" else None
        with pytest.raises(errors.KafkaTimeoutError, match="InitProducerId"):
            p.init_transactions(timeout=0.3)
        store.coordinator_fault = None
        assert p.transaction_state == "initializing"
        return p
    p.init_transactions()
    p.begin_transaction()
    if state is ProducerTxnState.READY:
        # Ready after a completed two-phase commit, so completing again works.
        _prepare(p)
        assert p.complete_transaction(_prepared[id(p)])
        assert p.transaction_state == "ready"
        return p
    if state is ProducerTxnState.IN_TRANSACTION:
        return p
    if state is ProducerTxnState.PREPARING:
        store.coordinator_fault = _unreachable("PrepareTransaction")
        with pytest.raises(errors.KafkaTimeoutError, match="PrepareTransaction"):
            p.prepare_transaction(timeout=0.3)
        store.coordinator_fault = None
        _prepared[id(p)] = PreparedTxnState(p.producer_id, p.producer_epoch)
        assert p.transaction_state == "preparing"
        return p
    if state in (ProducerTxnState.PREPARED_TRANSACTION, ProducerTxnState.COMPLETING):
        _prepare(p)
        if state is ProducerTxnState.COMPLETING:
            store.coordinator_fault = _unreachable("CompleteTransaction")
            with pytest.raises(errors.KafkaTimeoutError, match="CompleteTransaction"):
                p.complete_transaction(_prepared[id(p)], timeout=0.3)
            store.coordinator_fault = None
        assert p.transaction_state == state.value
        return p
    if state in (ProducerTxnState.COMMITTING, ProducerTxnState.ABORTING):
        p.send("t", value=b"x", partition=0)
        p.flush()
        store.coordinator_fault = _unreachable("EndTxn")
        with pytest.raises(errors.KafkaTimeoutError, match="EndTxn"):
            if state is ProducerTxnState.COMMITTING:
                p.commit_transaction(timeout=0.3)
            else:
                p.abort_transaction(timeout=0.3)
        store.coordinator_fault = None
        assert p.transaction_state == state.value
        return p
    if state is ProducerTxnState.ABORTABLE_ERROR:
        def corrupt(view: BatchView) -> ErrorCode | None:
            return ErrorCode.CORRUPT_MESSAGE if view.partition == 1 else None
        store.fault = corrupt
        fut = p.send("t", value=b"x", partition=1)
        assert isinstance(fut.exception(timeout=30), errors.CorruptRecordError)
        store.fault = None
        assert p.transaction_state == "abortable_error"
        return p
    assert state is ProducerTxnState.FATAL_ERROR
    store.coordinator_fault = (
        lambda name, _r: ErrorCode.PRODUCER_FENCED if name == "AddPartitionsToTxn" else None
    )
    fut = p.send("t", value=b"x", partition=0)
    assert isinstance(fut.exception(timeout=30), errors.ProducerFencedError)
    store.coordinator_fault = None
    assert p.transaction_state == "fatal_error"
    return p


_CALLS: dict[Op, Callable[[Producer], object]] = {
    Op.INIT_TRANSACTIONS: lambda p: p.init_transactions(timeout=10),
    Op.BEGIN_TRANSACTION: lambda p: p.begin_transaction(),
    Op.SEND: lambda p: p.send("t", value=b"y", partition=0),
    Op.SEND_OFFSETS: lambda p: p.send_offsets_to_transaction(
        {TopicPartition("t", 0): 5}, GroupMetadata("g", -1, ""), timeout=10),
    Op.COMMIT_TRANSACTION: lambda p: p.commit_transaction(timeout=10),
    Op.ABORT_TRANSACTION: lambda p: p.abort_transaction(timeout=10),
    Op.PREPARE_TRANSACTION: lambda p: p.prepare_transaction(timeout=10),
    Op.COMPLETE_TRANSACTION: lambda p: p.complete_transaction(
        _prepared.get(id(p), PreparedTxnState(0, 0)), timeout=10),
}


@pytest.mark.parametrize("state", list(ProducerTxnState), ids=lambda s: s.value)
def test_every_call_in_every_state_of_a_real_producer(
        store: InProcessCluster, state: ProducerTxnState) -> None:
    row = TABLE[state]
    for op in Op:
        p = _in_state(store, state)
        try:
            if op in row.accepts:
                _CALLS[op](p)  # must simply work
            elif op in row.raises_error:
                expected = (errors.ProducerFencedError if state is ProducerTxnState.FATAL_ERROR
                            else errors.TransactionAbortableError)
                with pytest.raises(expected):
                    _CALLS[op](p)
                assert p.transaction_state == state.value
            else:
                with pytest.raises(errors.IllegalStateError, match=state.value):
                    _CALLS[op](p)
                assert p.transaction_state == state.value
        finally:
            store.fault = None
            store.coordinator_fault = None
            p.close(timeout=10)
            _prepared.pop(id(p), None)


def test_two_phase_commit_calls_need_two_phase_commit(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address, transactional_id=f"tx-{next(_tid_counter)}",
                  linger_ms=1) as p:
        with pytest.raises(ValueError, match="transaction_two_phase_commit_enable"):
            p.init_transactions(keep_prepared_txn=True)
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(errors.InvalidTxnStateError,
                           match="transaction_two_phase_commit_enable"):
            p.prepare_transaction()
        with pytest.raises(errors.InvalidTxnStateError,
                           match="transaction_two_phase_commit_enable"):
            p.complete_transaction(PreparedTxnState(1, 0))
        assert p.transaction_state == "in_transaction"
        with pytest.raises(TypeError, match="PreparedTxnState"):
            p.complete_transaction("1:0")  # type: ignore[arg-type]


def test_transactional_calls_need_a_transactional_producer(store: InProcessCluster) -> None:
    with Producer(bootstrap=store.address) as p:
        for op, call in _CALLS.items():
            if op is Op.SEND:
                continue
            with pytest.raises(errors.IllegalStateError, match="transactional_id"):
                call(p)
        assert p.transaction_state is None
    with pytest.raises(ValueError, match="transactional_id"):
        Producer(bootstrap=store.address, transaction_two_phase_commit_enable=True)
    with pytest.raises(ValueError, match="enable_idempotence"):
        Producer(bootstrap=store.address, transactional_id="x", enable_idempotence=False)
    with pytest.raises(ValueError, match="transactional_id"):
        Producer(bootstrap=store.address, transactional_id="")
    p = _producer(store)
    p.close()
    with pytest.raises(errors.IllegalStateError, match="closed"):
        p.init_transactions()
