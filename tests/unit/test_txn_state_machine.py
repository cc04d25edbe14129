"""The transaction coordinator's state machine, as pure functions.

Method: walk every (from, to) pair of TxnState against the one transition
table; then drive the planners through the life of a transactional id
(init, add partitions, commit, retried commit, abort, fencing, timeout,
expiry, epoch exhaustion) and check each answer and each persisted value.
The two-phase-commit planners (KIP-939) get the same treatment: prepare,
keep across a new instance, complete with a matching or another prepared
state, repeated and retried completions, no timeout, the admin abort, and
the producer id and epoch the markers of each decision carry (always the
data's producer id, strictly above the data's epoch).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.kernel.invariants import InvariantViolation
from services.coordinator.core.transactions import (
    MAX_PRODUCER_EPOCH,
    VALID_PREVIOUS,
    TxnMetadata,
    TxnState,
    check_transition,
    is_timed_out,
    marker_target,
    needs_fresh_producer_id,
    plan_add_partitions,
    plan_admin_abort,
    plan_complete,
    plan_complete_prepared,
    plan_end_txn,
    plan_expire,
    plan_init_producer_id,
    plan_prepare,
    plan_timeout_abort,
)

TID = "copier-0"
P1 = frozenset({("payments", 0)})
P2 = frozenset({("payments", 1), ("ledger", 0)})


def _new(now_ms: int = 1000, producer_id: int = 7) -> TxnMetadata:
    return plan_init_producer_id(
        None, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
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
        _new(), transactional_id=TID, transaction_timeout_ms=30_000,
        max_transaction_timeout_ms=900_000,
        now_ms=5000, fresh_producer_id=None,
    )
    md = plan.to_persist
    assert (md.producer_id, md.producer_epoch, md.transaction_timeout_ms) == (7, 1, 30_000)
    assert not plan.abort_started


def test_init_with_an_open_transaction_fences_and_aborts_it() -> None:
    plan = plan_init_producer_id(
        _ongoing(), transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
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
            None, transactional_id=TID, transaction_timeout_ms=timeout_ms,
            max_transaction_timeout_ms=900_000,
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
        _ongoing(), transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
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
                     previous_producer_id=-1, previous_producer_epoch=-1,
                     transaction_timeout_ms=1000, state=TxnState.EMPTY)
    assert needs_fresh_producer_id(md)
    plan = plan_init_producer_id(md, transactional_id=TID, transaction_timeout_ms=1000,
                                 max_transaction_timeout_ms=900_000, now_ms=0, fresh_producer_id=99)
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
    decided = plan_complete_prepared(
        _kept(), transactional_id=TID, producer_id=7, producer_epoch=1, prepared=(7, 0),
        now_ms=9000, fresh_producer_id=None).to_persist
    assert decided is not None
    assert TxnMetadata.from_payload(TID, decided.to_payload()) == decided


def test_records_from_before_two_phase_commit_still_load() -> None:
    payload = _ongoing().to_payload()
    for name in ("two_phase_commit", "prepared_producer_id", "prepared_producer_epoch",
                 "prepared_outcome", "marker_producer_id", "marker_producer_epoch"):
        del payload[name]
    assert TxnMetadata.from_payload(TID, payload) == _ongoing()


# ------------------------------------------------ two-phase commit (KIP-939)


def _new_2pc() -> TxnMetadata:
    return plan_init_producer_id(
        None, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=1000, fresh_producer_id=7, two_phase_commit=True,
    ).to_persist


def _prepared() -> TxnMetadata:
    """Producer 7 epoch 0 wrote to P1 and prepared: prepared state (7, 0)."""
    ongoing = plan_add_partitions(
        _new_2pc(), transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P1,
        max_partitions=100, now_ms=2000,
    )
    prepared = plan_prepare(ongoing, transactional_id=TID, producer_id=7, producer_epoch=0,
                            now_ms=3000)
    assert prepared is not None
    return prepared


def _kept() -> TxnMetadata:
    """A new instance kept the prepared transaction: it holds epoch 1."""
    plan = plan_init_producer_id(
        _prepared(), transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=4000, fresh_producer_id=None, two_phase_commit=True, keep_prepared_txn=True,
    )
    assert plan.kept_prepared == (7, 0) and not plan.abort_started
    return plan.to_persist


def test_prepare_records_the_prepared_state_and_a_retry_changes_nothing() -> None:
    md = _prepared()
    assert (md.state, md.prepared_state, md.prepared_outcome) == (TxnState.PREPARED, (7, 0), "")
    assert (md.producer_id, md.producer_epoch, md.partitions) == (7, 0, P1)
    assert md.txn_start_ms == 2000
    assert plan_prepare(md, transactional_id=TID, producer_id=7, producer_epoch=0,
                        now_ms=3100) is None


def test_prepare_with_nothing_open_prepares_an_empty_transaction() -> None:
    md = plan_prepare(_new_2pc(), transactional_id=TID, producer_id=7, producer_epoch=0,
                      now_ms=3000)
    assert md is not None
    assert (md.state, md.partitions, md.txn_start_ms) == (TxnState.PREPARED, frozenset(), 3000)


def test_prepare_needs_a_two_phase_commit_producer() -> None:
    with pytest.raises(ServiceError) as err:
        plan_prepare(_ongoing(), transactional_id=TID, producer_id=7, producer_epoch=0,
                     now_ms=3000)
    assert err.value.code is ErrorCode.INVALID_TXN_STATE


def test_a_prepared_transaction_takes_no_more_partitions() -> None:
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(_prepared(), transactional_id=TID, producer_id=7, producer_epoch=0,
                            partitions=P2, max_partitions=100, now_ms=3500)
    assert err.value.code is ErrorCode.INVALID_TXN_STATE


def test_two_phase_commit_transactions_never_time_out() -> None:
    ongoing = plan_add_partitions(
        _new_2pc(), transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P1,
        max_partitions=100, now_ms=2000,
    )
    assert ongoing is not None
    for md in (ongoing, _prepared(), _kept()):
        assert not is_timed_out(md, 10**12)
        assert plan_timeout_abort(md, now_ms=10**12, fresh_producer_id=None) is None
    assert is_timed_out(_ongoing(), 2000 + 60_000)


def test_keep_prepared_txn_fences_the_old_instance_and_keeps_the_transaction() -> None:
    md = _kept()
    assert (md.state, md.producer_id, md.producer_epoch) == (TxnState.PREPARED, 7, 1)
    assert (md.prepared_state, md.partitions) == ((7, 0), P1)
    for attempt in (
        lambda: plan_end_txn(md, transactional_id=TID, producer_id=7, producer_epoch=0,
                             commit=True, now_ms=5000, fresh_producer_id=None),
        lambda: plan_complete_prepared(md, transactional_id=TID, producer_id=7,
                                       producer_epoch=0, prepared=(7, 0), now_ms=5000,
                                       fresh_producer_id=None),
    ):
        with pytest.raises(ServiceError) as err:
            attempt()
        assert err.value.code is ErrorCode.PRODUCER_FENCED
    # A third instance keeps it again.
    again = plan_init_producer_id(
        md, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=4500, fresh_producer_id=None, two_phase_commit=True, keep_prepared_txn=True,
    )
    assert (again.to_persist.producer_epoch, again.kept_prepared) == (2, (7, 0))


def test_keep_prepared_txn_needs_two_phase_commit() -> None:
    with pytest.raises(ServiceError) as err:
        plan_init_producer_id(
            _prepared(), transactional_id=TID, transaction_timeout_ms=60_000,
            max_transaction_timeout_ms=900_000, now_ms=4000, fresh_producer_id=None,
            keep_prepared_txn=True,
        )
    assert err.value.code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("keep", [False, True])
def test_init_aborts_an_open_transaction_that_was_never_prepared(keep: bool) -> None:
    ongoing = plan_add_partitions(
        _new_2pc(), transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P1,
        max_partitions=100, now_ms=2000,
    )
    plan = plan_init_producer_id(
        ongoing, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=4000, fresh_producer_id=None, two_phase_commit=True, keep_prepared_txn=keep,
    )
    assert plan.abort_started and plan.kept_prepared is None
    assert plan.to_persist.state is TxnState.PREPARE_ABORT
    assert marker_target(plan.to_persist) == (7, 1)


def test_init_without_keep_aborts_a_prepared_transaction() -> None:
    plan = plan_init_producer_id(
        _prepared(), transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=4000, fresh_producer_id=None,
    )
    assert plan.abort_started
    md = plan.to_persist
    assert (md.state, md.prepared_outcome, marker_target(md)) == (
        TxnState.PREPARE_ABORT, "abort", (7, 1))


def test_complete_with_the_prepared_state_commits_above_the_data_epoch() -> None:
    plan = plan_complete_prepared(
        _kept(), transactional_id=TID, producer_id=7, producer_epoch=1, prepared=(7, 0),
        now_ms=5000, fresh_producer_id=None,
    )
    md = plan.to_persist
    assert md is not None and plan.committed
    assert (md.state, md.partitions, md.prepared_outcome) == (
        TxnState.PREPARE_COMMIT, P1, "commit")
    # The data is at epoch 0; the completer held 1; the decision bumps to 2.
    assert (plan.producer_id, plan.producer_epoch) == (7, 2)
    assert marker_target(md) == (7, 2)
    assert plan_complete(md, now_ms=5100).state is TxnState.COMPLETE_COMMIT


def test_complete_with_another_prepared_state_aborts() -> None:
    plan = plan_complete_prepared(
        _kept(), transactional_id=TID, producer_id=7, producer_epoch=1, prepared=(7, 5),
        now_ms=5000, fresh_producer_id=None,
    )
    assert plan.to_persist is not None and not plan.committed
    assert (plan.to_persist.state, plan.to_persist.prepared_outcome) == (
        TxnState.PREPARE_ABORT, "abort")
    assert marker_target(plan.to_persist) == (7, 2)


@pytest.mark.parametrize("given", [(7, 0), (7, 5)])
def test_repeated_and_retried_completions_are_answered_without_a_change(
        given: tuple[int, int]) -> None:
    first = plan_complete_prepared(
        _kept(), transactional_id=TID, producer_id=7, producer_epoch=1, prepared=given,
        now_ms=5000, fresh_producer_id=None,
    )
    assert first.to_persist is not None
    decided = first.to_persist
    done = plan_complete(decided, now_ms=5100)
    for md in (decided, done):
        # The first answer was lost: the same request again (epoch 1).
        retry = plan_complete_prepared(
            md, transactional_id=TID, producer_id=7, producer_epoch=1, prepared=given,
            now_ms=5200, fresh_producer_id=None,
        )
        assert (retry.to_persist, retry.committed) == (None, first.committed)
        assert (retry.producer_id, retry.producer_epoch) == (7, 2)
    # Another process completes the same prepared state again, later: it
    # inits (nothing prepared any more: a plain bump) and asks.
    later = plan_init_producer_id(
        done, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=6000, fresh_producer_id=None, two_phase_commit=True, keep_prepared_txn=True,
    )
    assert later.kept_prepared is None and later.to_persist.state is TxnState.EMPTY
    repeated = plan_complete_prepared(
        later.to_persist, transactional_id=TID, producer_id=7, producer_epoch=3,
        prepared=(7, 0), now_ms=6100, fresh_producer_id=None,
    )
    assert (repeated.to_persist, repeated.committed) == (None, given == (7, 0))
    if given != (7, 0):
        return
    # A prepared state the coordinator has no record of cannot be answered.
    with pytest.raises(ServiceError) as err:
        plan_complete_prepared(
            later.to_persist, transactional_id=TID, producer_id=7, producer_epoch=3,
            prepared=(7, 9), now_ms=6100, fresh_producer_id=None,
        )
    assert err.value.code is ErrorCode.INVALID_TXN_STATE


def test_complete_of_an_open_transaction_that_is_not_prepared_is_invalid() -> None:
    ongoing = plan_add_partitions(
        _new_2pc(), transactional_id=TID, producer_id=7, producer_epoch=0, partitions=P1,
        max_partitions=100, now_ms=2000,
    )
    with pytest.raises(ServiceError) as err:
        plan_complete_prepared(ongoing, transactional_id=TID, producer_id=7, producer_epoch=0,
                               prepared=(7, 0), now_ms=3000, fresh_producer_id=None)
    assert err.value.code is ErrorCode.INVALID_TXN_STATE


def test_the_producer_that_prepared_may_end_its_transaction_itself() -> None:
    plan = plan_end_txn(_prepared(), transactional_id=TID, producer_id=7, producer_epoch=0,
                        commit=True, now_ms=5000, fresh_producer_id=None)
    assert plan.to_persist is not None
    assert (plan.to_persist.state, plan.to_persist.prepared_outcome) == (
        TxnState.PREPARE_COMMIT, "commit")
    assert marker_target(plan.to_persist) == (7, 1)


def test_admin_abort_aborts_a_prepared_transaction_and_nothing_idle() -> None:
    md = plan_admin_abort(_kept(), transactional_id=TID, now_ms=5000, fresh_producer_id=None)
    assert (md.state, md.prepared_outcome, md.bump_reason) == (
        TxnState.PREPARE_ABORT, "abort", "admin")
    assert marker_target(md) == (7, 2)
    with pytest.raises(ServiceError) as err:
        plan_admin_abort(_new_2pc(), transactional_id=TID, now_ms=5000,
                         fresh_producer_id=None)
    assert err.value.code is ErrorCode.INVALID_TXN_STATE
    with pytest.raises(ServiceError) as err:
        plan_admin_abort(None, transactional_id=TID, now_ms=5000, fresh_producer_id=None)
    assert err.value.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    assert repr(TID) in err.value.message


def test_a_kept_transaction_whose_epoch_runs_out_keeps_its_markers_on_the_data_id() -> None:
    prepared = replace(_prepared(), producer_epoch=MAX_PRODUCER_EPOCH,
                       prepared_producer_epoch=MAX_PRODUCER_EPOCH)
    kept = plan_init_producer_id(
        prepared, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000,
        now_ms=4000, fresh_producer_id=99, two_phase_commit=True, keep_prepared_txn=True,
    ).to_persist
    assert (kept.producer_id, kept.producer_epoch, kept.prepared_state) == (
        99, 0, (7, MAX_PRODUCER_EPOCH))
    plan = plan_complete_prepared(
        kept, transactional_id=TID, producer_id=99, producer_epoch=0,
        prepared=(7, MAX_PRODUCER_EPOCH), now_ms=5000, fresh_producer_id=None,
    )
    assert plan.committed and plan.to_persist is not None
    assert (plan.producer_id, plan.producer_epoch) == (99, 1)
    assert marker_target(plan.to_persist) == (7, MAX_PRODUCER_EPOCH + 1)
