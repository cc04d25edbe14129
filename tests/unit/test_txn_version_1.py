"""Transaction version 1 (Kafka's clients) and KIP-360 recovery, on the
coordinator's pure planners.

Goal: every path of version 1 answers as Kafka's coordinator before KIP-890
part 2 does, with the same table and planners as version 2: EndTxn decides
without an epoch bump and answers the same ids; markers carry the data's id
and epoch, stamped with a decision timestamp that strictly increases; a
retried EndTxn of the same outcome after completion succeeds (and asks the
runtime to confirm ownership), the other outcome is INVALID_TXN_STATE,
markers in flight are CONCURRENT_TRANSACTIONS; the timeout, a new instance
and the admin abort fence with a bump; epoch exhaustion rotates the producer
id only where a bump happens. KIP-360 (InitProducerId carrying the caller's
id and epoch) bumps only for the current ids, answers a retry of a recovery
with the current ids, and fences everyone else. The version and the decision
timestamp survive the transaction log's records; records written before
versions existed read as version 2.

Method: drive the planners through the life of a transactional id, persist
nothing but the returned values (as the runtime replays them), and check each
answer, error code and persisted field.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.coordinator.core.transactions import (
    MAX_PRODUCER_EPOCH,
    TransactionVersion,
    TxnMetadata,
    TxnState,
    marker_target,
    marker_timestamp,
    needs_fresh_producer_id,
    parse_expected_producer,
    parse_transaction_version,
    plan_add_partitions,
    plan_admin_abort,
    plan_complete,
    plan_end_txn,
    plan_init_producer_id,
    plan_timeout_abort,
    verify_partitions,
)

TID = "kafka-app-0"
PID = 7
P1 = frozenset({("payments", 0)})
P2 = frozenset({("payments", 1)})
V1 = TransactionVersion.V1
V2 = TransactionVersion.V2


def _init(md: TxnMetadata | None, *, now_ms: int = 1_000, fresh: int | None = PID,
          version: TransactionVersion = V1,
          expected: tuple[int, int] | None = None) -> TxnMetadata:
    plan = plan_init_producer_id(
        md, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000, now_ms=now_ms, fresh_producer_id=fresh,
        transaction_version=version, expected=expected,
    )
    assert not plan.abort_started and plan.persist
    return plan.to_persist


def _add(md: TxnMetadata, partitions: frozenset[tuple[str, int]] = P1,
         now_ms: int = 2_000) -> TxnMetadata:
    added = plan_add_partitions(
        md, transactional_id=TID, producer_id=md.producer_id, producer_epoch=md.producer_epoch,
        partitions=partitions, max_partitions=100, now_ms=now_ms,
    )
    assert added is not None
    return added


def _end(md: TxnMetadata, *, commit: bool, now_ms: int = 3_000,
         ids: tuple[int, int] | None = None, fresh: int | None = None) -> TxnMetadata:
    pid, epoch = ids or (md.producer_id, md.producer_epoch)
    plan = plan_end_txn(md, transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                        commit=commit, now_ms=now_ms, fresh_producer_id=fresh)
    assert plan.to_persist is not None
    return plan.to_persist


def _end_error(md: TxnMetadata, *, commit: bool, ids: tuple[int, int] | None = None) -> ErrorCode:
    pid, epoch = ids or (md.producer_id, md.producer_epoch)
    with pytest.raises(ServiceError) as err:
        plan_end_txn(md, transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                     commit=commit, now_ms=4_000, fresh_producer_id=None)
    return err.value.code


def test_version_0_means_2_and_unknown_versions_are_refused() -> None:
    assert parse_transaction_version(0) is V2
    assert parse_transaction_version(1) is V1
    assert parse_transaction_version(2) is V2
    with pytest.raises(ServiceError) as err:
        parse_transaction_version(3)
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert "3" in err.value.message


def test_the_version_is_kept_in_the_record_and_old_records_read_as_version_2() -> None:
    md = _end(_add(_init(None)), commit=True)
    back = TxnMetadata.from_payload(TID, md.to_payload())
    assert back == md
    assert (back.transaction_version, back.decision_timestamp_ms) == (V1, 3_000)
    old = md.to_payload()
    del old["transaction_version"], old["decision_timestamp_ms"]
    legacy = TxnMetadata.from_payload(TID, old)
    assert (legacy.transaction_version, legacy.decision_timestamp_ms) == (V2, -1)


def test_two_phase_commit_needs_version_2() -> None:
    with pytest.raises(ServiceError) as err:
        plan_init_producer_id(
            None, transactional_id=TID, transaction_timeout_ms=60_000,
            max_transaction_timeout_ms=900_000, now_ms=1, fresh_producer_id=PID,
            two_phase_commit=True, transaction_version=V1,
        )
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_commit_keeps_the_epoch_and_markers_carry_the_datas_epoch() -> None:
    ongoing = _add(_init(None))
    plan = plan_end_txn(ongoing, transactional_id=TID, producer_id=PID, producer_epoch=0,
                        commit=True, now_ms=3_000, fresh_producer_id=None)
    decided = plan.to_persist
    assert decided is not None
    assert (plan.producer_id, plan.producer_epoch) == (PID, 0)
    assert (decided.state, decided.producer_id, decided.producer_epoch) == (
        TxnState.PREPARE_COMMIT, PID, 0)
    assert decided.partitions == P1
    assert marker_target(decided) == (PID, 0)
    assert marker_timestamp(decided) == 3_000
    done = plan_complete(decided, now_ms=3_500)
    assert (done.state, done.producer_epoch, done.partitions) == (
        TxnState.COMPLETE_COMMIT, 0, frozenset())


def test_two_transactions_on_one_epoch_commit_then_abort_with_rising_timestamps() -> None:
    first = _end(_add(_init(None)), commit=True, now_ms=3_000)
    second_open = _add(plan_complete(first, now_ms=3_100), P2, now_ms=3_200)
    assert second_open.producer_epoch == 0 and second_open.partitions == P2
    # The coordinator's clock stepped back (another coordinator took over).
    second = _end(second_open, commit=False, now_ms=1_500)
    assert second.state is TxnState.PREPARE_ABORT
    assert marker_target(second) == (PID, 0)
    assert marker_timestamp(second) == 3_001  # above the first decision's, not the clock's


def test_abort_keeps_the_epoch() -> None:
    decided = _end(_add(_init(None)), commit=False)
    assert (decided.state, decided.producer_epoch) == (TxnState.PREPARE_ABORT, 0)
    assert marker_target(decided) == (PID, 0)


def test_retry_after_completion_same_outcome_succeeds_other_is_invalid() -> None:
    done = plan_complete(_end(_add(_init(None)), commit=True), now_ms=3_500)
    plan = plan_end_txn(done, transactional_id=TID, producer_id=PID, producer_epoch=0,
                        commit=True, now_ms=4_000, fresh_producer_id=None)
    assert (plan.to_persist, plan.producer_id, plan.producer_epoch) == (None, PID, 0)
    # Answered from memory: the runtime confirms it owns the log first.
    assert plan.confirm_owner
    assert _end_error(done, commit=False) is ErrorCode.INVALID_TXN_STATE
    aborted = plan_complete(_end(_add(_init(None)), commit=False), now_ms=3_500)
    assert _end_error(aborted, commit=True) is ErrorCode.INVALID_TXN_STATE
    again = plan_end_txn(aborted, transactional_id=TID, producer_id=PID, producer_epoch=0,
                         commit=False, now_ms=4_000, fresh_producer_id=None)
    assert again.to_persist is None and again.confirm_owner


def test_markers_in_flight_same_outcome_is_concurrent_other_is_invalid() -> None:
    committing = _end(_add(_init(None)), commit=True)
    assert _end_error(committing, commit=True) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert _end_error(committing, commit=False) is ErrorCode.INVALID_TXN_STATE
    aborting = _end(_add(_init(None)), commit=False)
    assert _end_error(aborting, commit=False) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert _end_error(aborting, commit=True) is ErrorCode.INVALID_TXN_STATE
    # Nor can the next transaction start.
    with pytest.raises(ServiceError) as err:
        plan_add_partitions(committing, transactional_id=TID, producer_id=PID, producer_epoch=0,
                            partitions=P2, max_partitions=100, now_ms=5_000)
    assert err.value.code is ErrorCode.CONCURRENT_TRANSACTIONS


def test_nothing_open_is_invalid_either_way_and_other_ids_are_refused() -> None:
    empty = _init(None)
    assert _end_error(empty, commit=True) is ErrorCode.INVALID_TXN_STATE
    assert _end_error(empty, commit=False) is ErrorCode.INVALID_TXN_STATE
    ongoing = _add(empty)
    assert _end_error(ongoing, commit=True, ids=(PID, 1)) is ErrorCode.PRODUCER_FENCED
    assert _end_error(ongoing, commit=True, ids=(PID + 1, 0)) is \
        ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_timeout_fences_with_an_epoch_bump() -> None:
    ongoing = _add(_init(None), now_ms=2_000)
    assert plan_timeout_abort(ongoing, now_ms=61_999, fresh_producer_id=None) is None
    fenced = plan_timeout_abort(ongoing, now_ms=62_000, fresh_producer_id=None)
    assert fenced is not None
    assert (fenced.state, fenced.producer_epoch, fenced.bump_reason) == (
        TxnState.PREPARE_ABORT, 1, "timeout")
    # Markers above the data's epoch: the stores fence the late producer too.
    assert marker_target(fenced) == (PID, 1)
    assert marker_timestamp(fenced) == 62_000
    assert _end_error(fenced, commit=True, ids=(PID, 0)) is ErrorCode.PRODUCER_FENCED
    done = plan_complete(fenced, now_ms=62_500)
    assert _end_error(done, commit=True, ids=(PID, 0)) is ErrorCode.PRODUCER_FENCED
    verdicts = verify_partitions(done, transactional_id=TID, producer_id=PID, producer_epoch=0,
                                 partitions=P1)
    assert {tp: e and e.code for tp, e in verdicts.items()} == {
        ("payments", 0): ErrorCode.PRODUCER_FENCED}


def test_admin_abort_fences_with_an_epoch_bump() -> None:
    aborted = plan_admin_abort(_add(_init(None)), transactional_id=TID, now_ms=5_000,
                               fresh_producer_id=None)
    assert (aborted.producer_epoch, marker_target(aborted)) == (1, (PID, 1))


def test_reinit_aborts_what_was_left_then_bumps_and_may_change_the_version() -> None:
    ongoing = _add(_init(None))
    plan = plan_init_producer_id(
        ongoing, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000, now_ms=5_000, fresh_producer_id=None,
        transaction_version=V1,
    )
    assert plan.abort_started
    assert (plan.to_persist.state, plan.to_persist.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    assert marker_target(plan.to_persist) == (PID, 1)
    retried = _init(plan_complete(plan.to_persist, now_ms=5_500), version=V2, fresh=None)
    assert (retried.state, retried.producer_epoch, retried.transaction_version) == (
        TxnState.EMPTY, 2, V2)
    # Under version 2 now: EndTxn bumps.
    decided = _end(_add(retried), commit=True)
    assert decided.producer_epoch == 3
    back = _init(plan_complete(decided, now_ms=6_000), version=V1, fresh=None)
    assert (back.producer_epoch, back.transaction_version) == (4, V1)


def test_epoch_exhaustion_rotates_only_where_a_bump_happens() -> None:
    at_max = replace(_add(_init(None)), producer_epoch=MAX_PRODUCER_EPOCH)
    # EndTxn never bumps in version 1: no fresh producer id is needed.
    assert not needs_fresh_producer_id(at_max, end_txn=True)
    assert needs_fresh_producer_id(at_max)
    decided = _end(at_max, commit=True)
    assert (decided.producer_id, decided.producer_epoch) == (PID, MAX_PRODUCER_EPOCH)
    assert marker_target(decided) == (PID, MAX_PRODUCER_EPOCH)
    # The timeout's fence rotates: markers stay on the data's id, one above.
    fenced = plan_timeout_abort(at_max, now_ms=10**9, fresh_producer_id=99)
    assert fenced is not None
    assert (fenced.producer_id, fenced.producer_epoch) == (99, 0)
    assert marker_target(fenced) == (PID, MAX_PRODUCER_EPOCH + 1)
    # So does a new instance.
    idle = plan_complete(decided, now_ms=4_000)
    rotated = _init(idle, fresh=100)
    assert (rotated.producer_id, rotated.producer_epoch, rotated.transaction_version) == (
        100, 0, V1)


# ------------------------------------------------------------------ KIP-360


def test_expected_ids_are_read_as_kafka_reads_them() -> None:
    assert parse_expected_producer(None, None, transactional_id=TID) is None
    assert parse_expected_producer(-1, -1, transactional_id=TID) is None
    assert parse_expected_producer(PID, 3, transactional_id=TID) == (PID, 3)
    for pid, epoch in ((-1, 3), (PID, -1), (PID, None), (-5, -1)):
        with pytest.raises(ServiceError) as err:
            parse_expected_producer(pid, epoch, transactional_id=TID)
        assert err.value.code is ErrorCode.INVALID_REQUEST


def test_recovery_with_the_current_ids_bumps_and_a_retry_gets_the_same_answer() -> None:
    done = plan_complete(_end(_add(_init(None)), commit=False), now_ms=3_500)
    recovered = _init(done, expected=(PID, 0), fresh=None, now_ms=4_000)
    assert (recovered.state, recovered.producer_epoch, recovered.bump_reason) == (
        TxnState.EMPTY, 1, "recover")
    # Its answer was lost: the retry names the ids from before the bump.
    retry = plan_init_producer_id(
        recovered, transactional_id=TID, transaction_timeout_ms=30_000,
        max_transaction_timeout_ms=900_000, now_ms=4_500, fresh_producer_id=None,
        transaction_version=V1, expected=(PID, 0),
    )
    assert retry.persist and not retry.abort_started
    assert (retry.to_persist.producer_id, retry.to_persist.producer_epoch) == (PID, 1)
    assert retry.to_persist.transaction_timeout_ms == 30_000
    # A late copy while the recovered producer's next transaction is open
    # changes nothing.
    ongoing = _add(recovered)
    late = plan_init_producer_id(
        ongoing, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000, now_ms=5_000, fresh_producer_id=None,
        transaction_version=V1, expected=(PID, 0),
    )
    assert not late.persist and late.to_persist == ongoing
    # Recovering again from the recovered epoch bumps again.
    assert _init(recovered, expected=(PID, 1), fresh=None).producer_epoch == 2


def test_recovery_from_any_other_ids_is_fenced() -> None:
    md = _init(_init(None), fresh=None)  # a second instance: epoch 1, reason "init"
    for expected in ((PID, 0), (PID, 2), (PID + 1, 1)):
        with pytest.raises(ServiceError) as err:
            plan_init_producer_id(
                md, transactional_id=TID, transaction_timeout_ms=60_000,
                max_transaction_timeout_ms=900_000, now_ms=5_000, fresh_producer_id=None,
                transaction_version=V1, expected=expected,
            )
        assert err.value.code is ErrorCode.PRODUCER_FENCED
        assert f"epoch {expected[1]}" in err.value.message
    # The instance that recovered is fenced by a new one: its old ids no longer pass.
    recovered = _init(md, expected=(PID, 1), fresh=None)
    newer = _init(recovered, fresh=None)
    with pytest.raises(ServiceError) as err:
        plan_init_producer_id(
            newer, transactional_id=TID, transaction_timeout_ms=60_000,
            max_transaction_timeout_ms=900_000, now_ms=6_000, fresh_producer_id=None,
            transaction_version=V1, expected=(PID, 1),
        )
    assert err.value.code is ErrorCode.PRODUCER_FENCED


def test_recovery_with_a_transaction_open_aborts_it_once() -> None:
    ongoing = _add(_init(None))
    plan = plan_init_producer_id(
        ongoing, transactional_id=TID, transaction_timeout_ms=60_000,
        max_transaction_timeout_ms=900_000, now_ms=5_000, fresh_producer_id=None,
        transaction_version=V1, expected=(PID, 0),
    )
    assert plan.abort_started
    assert (plan.to_persist.producer_epoch, plan.to_persist.bump_reason) == (1, "recover")
    with pytest.raises(ServiceError) as err:  # markers in flight
        plan_init_producer_id(
            plan.to_persist, transactional_id=TID, transaction_timeout_ms=60_000,
            max_transaction_timeout_ms=900_000, now_ms=5_100, fresh_producer_id=None,
            transaction_version=V1, expected=(PID, 0),
        )
    assert err.value.code is ErrorCode.CONCURRENT_TRANSACTIONS
    # The client's retry after the abort: the fence's epoch, no second bump.
    retried = _init(plan_complete(plan.to_persist, now_ms=5_500), expected=(PID, 0), fresh=None)
    assert (retried.state, retried.producer_epoch) == (TxnState.EMPTY, 1)


def test_recovery_at_epoch_exhaustion_rotates_and_its_retry_is_recognised() -> None:
    at_max = replace(_init(None), producer_epoch=MAX_PRODUCER_EPOCH)
    rotated = _init(at_max, expected=(PID, MAX_PRODUCER_EPOCH), fresh=42)
    assert (rotated.producer_id, rotated.producer_epoch) == (42, 0)
    assert (rotated.previous_producer_id, rotated.previous_producer_epoch) == (
        PID, MAX_PRODUCER_EPOCH)
    retry = _init(rotated, expected=(PID, MAX_PRODUCER_EPOCH), fresh=None)
    assert (retry.producer_id, retry.producer_epoch) == (42, 0)


def test_recovery_of_an_unknown_id_starts_it_over() -> None:
    """Kafka's rule: a producer whose transactional id expired gets a new
    producer id (it recovers from INVALID_PRODUCER_ID_MAPPING)."""
    md = _init(None, expected=(PID, 5), fresh=11)
    assert (md.producer_id, md.producer_epoch, md.transaction_version) == (11, 0, V1)
