"""The transaction coordinator's state machine, as pure functions.

Method: walk every (from, to) pair of TxnState against the one transition
table; then drive the planners through the life of a transactional id
(init, add partitions, commit, retried commit, abort, fencing, timeout,
expiry, epoch exhaustion) and check each answer and each persisted value.
"""

from __future__ import annotations

import itertools

import pytest

from oncelog.errors import ErrorCode
from services.common.errors import InvariantViolation, ServiceError
from services.coordinator.core.transactions import (
    MAX_PRODUCER_EPOCH,
    VALID_PREVIOUS,
    TxnMetadata,
    TxnState,
    check_transition,
    needs_fresh_producer_id,
    plan_add_partitions,
    plan_complete,
    plan_end_txn,
    plan_expire,
    plan_init_producer_id,
    plan_timeout_abort,
)

TID = "copier-0"
P1 = frozenset({("payments", 0)})
P2 = frozenset({("payments", 1), ("ledger", 0)})


def _new(now_ms: int = 1000, producer_id: int = 7) -> TxnMetadata:
    return plan_init_producer_id(
        None, transactional_id=TID, txn_timeout_ms=60_000, max_txn_timeout_ms=900_000,
        now_ms=now_ms, fresh_producer_id=producer_id,
    ).to_persist


def _ongoing() -> TxnMetadata:
    md = plan_add_partitions(
        _new(), transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P1,
        max_partitions=100, now_ms=2000,
    )
    assert md is not None
    return md


@pytest.mark.parametrize(("current", "target"), list(itertools.product(TxnState, TxnState)))
def test_every_transition_pair_follows_the_table(current: TxnState, target: TxnState) -> None:
    if current in VALID_PREVIOUS[target]:
        check_transition(current, target, TID)
    else:
        with pytest.raises(InvariantViolation):
            check_transition(current, target, TID)


def test_new_transactional_id_gets_epoch_zero() -> None:
    md = _new()
    assert (md.producer_id, md.producer_epoch, md.state) == (7, 0, TxnState.EMPTY)
    assert needs_fresh_producer_id(None)
    assert not needs_fresh_producer_id(md)


def test_init_again_bumps_the_epoch_and_keeps_the_id() -> None:
    plan = plan_init_producer_id(
        _new(), transactional_id=TID, txn_timeout_ms=30_000, max_txn_timeout_ms=900_000,
        now_ms=5000, fresh_producer_id=None,
    )
    md = plan.to_persist
    assert (md.producer_id, md.producer_epoch, md.txn_timeout_ms) == (7, 1, 30_000)
    assert not plan.abort_started


def test_init_with_an_open_transaction_fences_and_aborts_it() -> None:
    plan = plan_init_producer_id(
        _ongoing(), transactional_id=TID, txn_timeout_ms=60_000, max_txn_timeout_ms=900_000,
        now_ms=5000, fresh_producer_id=None,
    )
    assert plan.abort_started
    assert plan.to_persist.state is TxnState.PREPARE_ABORT
    assert plan.to_persist.producer_epoch == 1
    assert plan.to_persist.partitions == P1


@pytest.mark.parametrize("timeout_ms", [0, -1, 900_001])
def test_init_rejects_timeouts_outside_the_limit(timeout_ms: int) -> None:
    with pytest.raises(ServiceError) as err:
        plan_init_producer_id(
            None, transactional_id=TID, txn_timeout_ms=timeout_ms, max_txn_timeout_ms=900_000,
            now_ms=0, fresh_producer_id=1,
        )
    assert err.value.code is ErrorCode.INVALID_TRANSACTION_TIMEOUT


def test_add_partitions_opens_and_extends_the_transaction() -> None:
    md = _ongoing()
    assert (md.state, md.partitions, md.txn_start_ms) == (TxnState.ONGOING, P1, 2000)
    again = plan_add_partitions(
        md, transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P1,
        max_partitions=100, now_ms=3000,
    )
    assert again is None
    more = plan_add_partitions(
        md, transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P2,
        max_partitions=100, now_ms=3000,
    )
    assert more is not None
    assert more.partitions == P1 | P2
    assert more.txn_start_ms == 2000


@pytest.mark.parametrize(
    ("producer_id", "producer_epoch", "code"),
    [
        (7, 1, ErrorCode.PRODUCER_FENCED),
        (7, -1, ErrorCode.PRODUCER_FENCED),
        (8, 0, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
    ],
)
def test_add_partitions_checks_the_producer(producer_id: int, producer_epoch: int,
                                            code: ErrorCode) -> None:
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(
            _new(), transactional_id=TID, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=P1, max_partitions=100, now_ms=0,
        )
    assert err.value.code is code


def test_add_partitions_to_an_unknown_id_is_a_mapping_error() -> None:
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(None, transactional_id=TID, producer_id=7, producer_epoch=0,
                            partitions=P1, max_partitions=100, now_ms=0)
    assert err.value.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_add_partitions_bounded() -> None:
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(_new(), transactional_id=TID, producer_id=7, producer_epoch=0,
                            partitions=P1 | P2, max_partitions=2, now_ms=0)
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_commit_bumps_the_epoch_then_completes() -> None:
    plan = plan_end_txn(_ongoing(), transactional_id=TID, producer_id=7, producer_epoch=0,
                        commit=True, now_ms=4000, fresh_producer_id=None)
    prepared = plan.to_persist
    assert prepared is not None
    assert prepared.state is TxnState.PREPARE_COMMIT
    assert (plan.producer_id, plan.producer_epoch) == (7, 1)
    assert prepared.partitions == P1
    done = plan_complete(prepared, now_ms=4100)
    assert done.state is TxnState.COMPLETE_COMMIT
    assert done.partitions == frozenset()


def test_retried_commit_after_a_lost_reply_succeeds_and_abort_does_not() -> None:
    prepared = plan_end_txn(_ongoing(), transactional_id=TID, producer_id=7, producer_epoch=0,
                            commit=True, now_ms=4000, fresh_producer_id=None).to_persist
    assert prepared is not None
    for md in (prepared, plan_complete(prepared, now_ms=4100)):
        retry = plan_end_txn(md, transactional_id=TID, producer_id=7, producer_epoch=0,
                             commit=True, now_ms=4200, fresh_producer_id=None)
        assert retry.to_persist is None
        assert (retry.producer_id, retry.producer_epoch) == (7, 1)
        with pytest.raises(ServiceError) as err:
            plan_end_txn(md, transactional_id=TID, producer_id=7, producer_epoch=0,
                         commit=False, now_ms=4200, fresh_producer_id=None)
        assert err.value.code is ErrorCode.INVALID_TXN_STATE


def test_new_transaction_waits_while_markers_are_in_flight() -> None:
    prepared = plan_end_txn(_ongoing(), transactional_id=TID, producer_id=7, producer_epoch=0,
                            commit=True, now_ms=4000, fresh_producer_id=None).to_persist
    assert prepared is not None
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(prepared, transactional_id=TID, producer_id=7, producer_epoch=1,
                            partitions=P1, max_partitions=100, now_ms=4100)
    assert err.value.code is ErrorCode.CONCURRENT_TRANSACTIONS


def test_commit_with_nothing_open_is_invalid_but_abort_bumps() -> None:
    with pytest.raises(ServiceError) as err:
        plan_end_txn(_new(), transactional_id=TID, producer_id=7, producer_epoch=0,
                     commit=True, now_ms=0, fresh_producer_id=None)
    assert err.value.code is ErrorCode.INVALID_TXN_STATE
    plan = plan_end_txn(_new(), transactional_id=TID, producer_id=7, producer_epoch=0,
                        commit=False, now_ms=0, fresh_producer_id=None)
    assert plan.to_persist is not None
    assert plan.to_persist.state is TxnState.PREPARE_ABORT
    assert plan.producer_epoch == 1


def test_stale_epoch_end_txn_is_fenced() -> None:
    md = plan_init_producer_id(
        _ongoing(), transactional_id=TID, txn_timeout_ms=60_000, max_txn_timeout_ms=900_000,
        now_ms=5000, fresh_producer_id=None,
    ).to_persist
    done = plan_complete(md, now_ms=5100)
    # The zombie still holds epoch 0. The fence moved the id to epoch 1; the
    # zombie's commit is not a retry of an EndTxn, so it is fenced.
    with pytest.raises(ServiceError) as err:
        plan_end_txn(done, transactional_id=TID, producer_id=7, producer_epoch=0,
                     commit=True, now_ms=5200, fresh_producer_id=None)
    assert err.value.code is ErrorCode.PRODUCER_FENCED
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(done, transactional_id=TID, producer_id=7, producer_epoch=0,
                            partitions=P1, max_partitions=100, now_ms=5200)
    assert err.value.code is ErrorCode.PRODUCER_FENCED


def test_timeout_aborts_with_an_epoch_bump() -> None:
    md = _ongoing()
    assert plan_timeout_abort(md, now_ms=2000 + 59_999, fresh_producer_id=None) is None
    aborted = plan_timeout_abort(md, now_ms=2000 + 60_000, fresh_producer_id=None)
    assert aborted is not None
    assert (aborted.state, aborted.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    with pytest.raises(ServiceError) as err:
        plan_end_txn(plan_complete(aborted, now_ms=70_000), transactional_id=TID, producer_id=7,
                     producer_epoch=0, commit=True, now_ms=70_001, fresh_producer_id=None)
    assert err.value.code is ErrorCode.PRODUCER_FENCED


def test_epoch_exhaustion_rotates_the_producer_id() -> None:
    md = TxnMetadata(transactional_id=TID, producer_id=7, producer_epoch=MAX_PRODUCER_EPOCH,
                     previous_producer_id=-1, previous_producer_epoch=-1, txn_timeout_ms=1000,
                     state=TxnState.EMPTY)
    assert needs_fresh_producer_id(md)
    plan = plan_init_producer_id(md, transactional_id=TID, txn_timeout_ms=1000,
                                 max_txn_timeout_ms=900_000, now_ms=0, fresh_producer_id=99)
    assert (plan.to_persist.producer_id, plan.to_persist.producer_epoch) == (99, 0)
    assert plan.to_persist.previous_producer_id == 7


def test_expiry_only_of_idle_ids() -> None:
    md = _new(now_ms=0)
    assert not plan_expire(md, now_ms=99, expiration_ms=100)
    assert plan_expire(md, now_ms=100, expiration_ms=100)
    assert not plan_expire(_ongoing(), now_ms=10**9, expiration_ms=100)


def test_payload_round_trip() -> None:
    md = _ongoing()
    assert TxnMetadata.from_payload(TID, md.to_payload()) == md
