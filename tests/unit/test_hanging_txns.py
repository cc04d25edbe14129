"""Hanging transactions: the pure decision of who ends a transaction that
holds a partition open past its timeout.

Goal: a store aborts a transaction by itself only when every
`__transaction_state` partition says that nobody knows it; a transaction a
coordinator holds open, or has decided (to commit above all), is left to
that coordinator; and the store's own ABORT marker fences the transaction's
zombie producer without refusing any later marker of a real coordinator.

Method:
* the coordinator's side (services/coordinator/core/hanging.py): drive a
  transactional id through its life with the real planners (version 2,
  version 1, two-phase commit kept by a new instance, epoch exhaustion, a
  record from before `decided_producer_epoch`) and, at each step, ask about
  the transaction at the data's epoch, the epochs around it and another
  producer id; each row names the fate and what the store then does;
* the store's side (services/partition_store/core/hanging_txns.py): every
  combination of answers of two `__transaction_state` partitions (no answer
  or each fate) against the table of its docstring, and a missing partition;
* the marker the store writes, applied with the real marker rules
  (core/producer_state.py) and then confronted with what may come after it:
  the zombie's late batch, a real coordinator's markers of both versions and
  coordinator epochs, the producer's next transaction.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from oncelog.errors import ErrorCode
from oncelog.records import (
    MARKER_ABORT,
    MARKER_COMMIT,
    MAX_PRODUCER_EPOCH,
    encode_batch,
    read_header,
)
from oncelog.v1 import coordinator_pb2
from services.common.kernel.txn_fate import TxnFate
from services.coordinator.core import transactions as txn
from services.coordinator.core.hanging import (
    StoreQuestion,
    answer,
    decided_marker,
    fate_of,
    plan_hanging_abort,
)
from services.partition_store.core.hanging_txns import (
    STORE_ABORT_TIMESTAMP_MS,
    HangingPolicy,
    OpenTxn,
    Resolution,
    decide,
    open_transactions,
    store_abort_marker,
)
from services.partition_store.core.outcomes import Rejection
from services.partition_store.core.producer_state import (
    NO_TIME_MS,
    NeedsVerification,
    ProducerEntry,
    ProducerStateManager,
    TxnMarker,
    WriteMarker,
)

TID = "payments-copier"
TP = ("payments", 3)
PID = 7
OTHER_PID = 8
TIMEOUT_MS = 60_000
V1 = txn.TransactionVersion.V1
V2 = txn.TransactionVersion.V2


def test_fates_mirror_the_proto_enum() -> None:
    proto = {v.name: v.number for v in coordinator_pb2.TransactionFate.DESCRIPTOR.values
             if v.number != 0}
    assert proto == {f"FATE_{fate.name}": int(fate) for fate in TxnFate}


# ------------------------------------------------------ the coordinator's side


def _init(*, version: txn.TransactionVersion = V2, two_phase_commit: bool = False,
          producer_id: int = PID) -> txn.TxnMetadata:
    return txn.plan_init_producer_id(
        None, transactional_id=TID, transaction_timeout_ms=TIMEOUT_MS,
        max_transaction_timeout_ms=900_000, now_ms=1_000, fresh_producer_id=producer_id,
        two_phase_commit=two_phase_commit, transaction_version=version,
    ).to_persist


def _add(md: txn.TxnMetadata, now_ms: int = 2_000) -> txn.TxnMetadata:
    added = txn.plan_add_partitions(
        md, transactional_id=TID, producer_id=md.producer_id, producer_epoch=md.producer_epoch,
        partitions=frozenset({TP}), max_partitions=10, now_ms=now_ms)
    assert added is not None
    return added


def _end(md: txn.TxnMetadata, *, commit: bool, fresh: int | None = None) -> txn.TxnMetadata:
    planned = txn.plan_end_txn(
        md, transactional_id=TID, producer_id=md.producer_id, producer_epoch=md.producer_epoch,
        commit=commit, now_ms=5_000, fresh_producer_id=fresh).to_persist
    assert planned is not None
    return planned


def _complete(md: txn.TxnMetadata) -> txn.TxnMetadata:
    return txn.plan_complete(md, now_ms=6_000)


def _life_v2() -> dict[str, txn.TxnMetadata]:
    empty = _init()
    ongoing = _add(empty)                                   # data at (PID, 0)
    prepare_commit = _end(ongoing, commit=True)             # epoch 1, marker (PID, 1)
    complete_commit = _complete(prepare_commit)
    next_ongoing = _add(complete_commit, now_ms=7_000)      # data at (PID, 1)
    timed_out = txn.plan_timeout_abort(next_ongoing, now_ms=7_000 + TIMEOUT_MS,
                                       fresh_producer_id=None)
    assert timed_out is not None                            # epoch 2, marker (PID, 2)
    return {"empty": empty, "ongoing": ongoing, "prepare_commit": prepare_commit,
            "complete_commit": complete_commit, "next_ongoing": next_ongoing,
            "timeout_abort": timed_out, "complete_abort": _complete(timed_out)}


def _life_v1() -> dict[str, txn.TxnMetadata]:
    ongoing = _add(_init(version=V1))                       # data at (PID, 0)
    prepare_commit = _end(ongoing, commit=True)             # no bump: marker (PID, 0)
    complete_commit = _complete(prepare_commit)
    next_ongoing = _add(complete_commit, now_ms=7_000)      # data at (PID, 0) again
    fenced = txn.plan_timeout_abort(next_ongoing, now_ms=7_000 + TIMEOUT_MS,
                                    fresh_producer_id=None)
    assert fenced is not None                               # a fence bumps: marker (PID, 1)
    return {"ongoing": ongoing, "prepare_commit": prepare_commit,
            "complete_commit": complete_commit, "next_ongoing": next_ongoing,
            "timeout_abort": fenced}


def _life_two_phase_commit() -> dict[str, txn.TxnMetadata]:
    ongoing = _add(_init(two_phase_commit=True))            # data at (PID, 0)
    prepared = txn.plan_prepare(ongoing, transactional_id=TID, producer_id=PID,
                                producer_epoch=0, now_ms=3_000)
    assert prepared is not None
    kept = txn.plan_init_producer_id(
        prepared, transactional_id=TID, transaction_timeout_ms=TIMEOUT_MS,
        max_transaction_timeout_ms=900_000, now_ms=4_000, fresh_producer_id=None,
        two_phase_commit=True, keep_prepared_txn=True).to_persist   # epoch 1, data still 0
    committed = txn.plan_complete_prepared(
        kept, transactional_id=TID, producer_id=PID, producer_epoch=1, prepared=(PID, 0),
        now_ms=5_000, fresh_producer_id=None).to_persist            # epoch 2, marker (PID, 2)
    assert committed is not None
    return {"ongoing": ongoing, "prepared": prepared, "kept": kept,
            "prepare_commit": committed, "complete_commit": _complete(committed),
            # A record written before decisions named their data's epoch.
            "legacy_complete_commit": replace(_complete(committed), decided_producer_epoch=-1)}


def _life_exhausted() -> dict[str, txn.TxnMetadata]:
    last = replace(_init(), producer_epoch=txn.MAX_PRODUCER_EPOCH)
    ongoing = _add(last)                                    # data at (PID, MAX)
    rotated = _end(ongoing, commit=True, fresh=OTHER_PID)   # (OTHER_PID, 0), marker (PID, MAX+1)
    return {"ongoing": ongoing, "rotated_commit": rotated}


LIVES = {"v2": _life_v2(), "v1": _life_v1(), "2pc": _life_two_phase_commit(),
         "exhausted": _life_exhausted()}
DECISION_TS = LIVES["v1"]["prepare_commit"].decision_timestamp_ms
E_MAX = txn.MAX_PRODUCER_EPOCH
NOW_MS = 10_000          # every Ongoing transaction above is within its timeout then
S = Resolution.STORE_ABORTS
W = Resolution.WAIT_OPEN
CA = Resolution.COORDINATOR_ABORTS
CC = Resolution.COORDINATOR_COMMITS

# (life, step, store's data (producer id, epoch), store's last marker timestamp
# at that epoch, the fate, what the store does when every other
# __transaction_state partition answers UNKNOWN).
ROWS = [
    # Version 2: one transaction per epoch.
    ("v2", "empty", (PID, 0), -1, None, S),
    ("v2", "ongoing", (PID, 0), -1, TxnFate.ONGOING, W),
    ("v2", "ongoing", (PID, 1), -1, None, S),            # newer than anything it has
    ("v2", "ongoing", (OTHER_PID, 0), -1, None, S),      # a producer id it never gave out
    ("v2", "prepare_commit", (PID, 0), -1, TxnFate.DECIDED_COMMIT, CC),
    ("v2", "prepare_commit", (PID, 1), -1, None, S),
    ("v2", "complete_commit", (PID, 0), -1, TxnFate.DECIDED_COMMIT, CC),  # marker lost here
    ("v2", "next_ongoing", (PID, 0), -1, None, S),       # moved on without its marker here
    ("v2", "next_ongoing", (PID, 1), -1, TxnFate.ONGOING, W),
    ("v2", "timeout_abort", (PID, 1), -1, TxnFate.DECIDED_ABORT, CA),
    ("v2", "complete_abort", (PID, 1), -1, TxnFate.DECIDED_ABORT, CA),
    ("v2", "complete_abort", (PID, 0), -1, None, S),
    # Version 1: transactions share the epoch; the decision's timestamp tells them apart.
    ("v1", "ongoing", (PID, 0), -1, TxnFate.ONGOING, W),
    ("v1", "prepare_commit", (PID, 0), -1, TxnFate.DECIDED_COMMIT, CC),
    ("v1", "complete_commit", (PID, 0), -1, TxnFate.DECIDED_COMMIT, CC),
    # Its COMMIT landed here already: what is open came after it (KIP-890's late produce).
    ("v1", "complete_commit", (PID, 0), DECISION_TS, None, S),
    ("v1", "next_ongoing", (PID, 0), DECISION_TS, TxnFate.ONGOING, W),
    ("v1", "timeout_abort", (PID, 0), DECISION_TS, TxnFate.DECIDED_ABORT, CA),
    ("v1", "timeout_abort", (PID, 1), -1, None, S),
    # Two-phase commit: never timed out; a kept transaction sits below the epoch.
    ("2pc", "ongoing", (PID, 0), -1, TxnFate.HELD_OPEN, W),
    ("2pc", "prepared", (PID, 0), -1, TxnFate.HELD_OPEN, W),
    ("2pc", "kept", (PID, 0), -1, TxnFate.HELD_OPEN, W),
    ("2pc", "kept", (PID, 1), -1, None, S),
    ("2pc", "prepare_commit", (PID, 0), -1, TxnFate.DECIDED_COMMIT, CC),
    ("2pc", "complete_commit", (PID, 0), -1, TxnFate.DECIDED_COMMIT, CC),
    ("2pc", "complete_commit", (PID, 1), -1, None, S),
    # Nobody can tell which transaction an old record decided: left to an operator.
    ("2pc", "legacy_complete_commit", (PID, 0), -1, TxnFate.HELD_OPEN, W),
    ("2pc", "legacy_complete_commit", (PID, 1), -1, TxnFate.HELD_OPEN, W),
    # Epoch exhaustion: the decision stays on the data's producer id.
    ("exhausted", "ongoing", (PID, E_MAX), -1, TxnFate.ONGOING, W),
    ("exhausted", "rotated_commit", (PID, E_MAX), -1, TxnFate.DECIDED_COMMIT, CC),
    ("exhausted", "rotated_commit", (OTHER_PID, 0), -1, None, S),
]


@pytest.mark.parametrize(("life", "step", "data", "marker_ts", "fate", "resolution"), ROWS,
                         ids=[f"{r[0]}-{r[1]}-{r[2][0]}.{r[2][1]}-{r[3]}" for r in ROWS])
def test_each_step_of_a_life_answers_the_store(
        life: str, step: str, data: tuple[int, int], marker_ts: int, fate: TxnFate | None,
        resolution: Resolution) -> None:
    md = LIVES[life][step]
    question = StoreQuestion(data[0], data[1], TP, marker_ts)
    assert fate_of(md, question, NOW_MS) is fate
    found = answer([md], question, NOW_MS)
    assert found.fate is (fate or TxnFate.UNKNOWN)
    assert found.transactional_id == ("" if fate is None else TID)
    # Every other __transaction_state partition knows nothing of it.
    assert decide({0: TxnFate.UNKNOWN, 1: found.fate, 2: TxnFate.UNKNOWN},
                  partitions=3) is resolution


def test_a_decided_commit_is_never_left_to_the_store() -> None:
    """Over every step and every epoch around it: whenever the id's last
    decision is a commit of exactly the store's data (and its marker has
    not landed there), the store waits for that COMMIT."""
    for steps in LIVES.values():
        for md in steps.values():
            decided = md.state in (txn.TxnState.PREPARE_COMMIT, txn.TxnState.COMPLETE_COMMIT)
            for epoch, producer_id in itertools.product(range(-1, 3), (PID, OTHER_PID)):
                data_epoch = md.decided_producer_epoch + epoch if decided else epoch
                question = StoreQuestion(producer_id, max(data_epoch, 0), TP)
                fate = answer([md], question, NOW_MS).fate
                if decided and (md.marker_producer_id, md.decided_producer_epoch) == (
                        question.producer_id, question.producer_epoch):
                    assert fate is TxnFate.DECIDED_COMMIT, (md, question)


def test_past_its_timeout_an_ongoing_transaction_is_aborting_and_its_abort_covers_the_store(
) -> None:
    ongoing = LIVES["v2"]["ongoing"]
    question = StoreQuestion(PID, 0, ("ledger", 0))     # a partition it never added
    expired_ms = ongoing.txn_start_ms + TIMEOUT_MS
    assert fate_of(ongoing, question, expired_ms - 1) is TxnFate.ONGOING
    assert fate_of(ongoing, question, expired_ms) is TxnFate.ABORTING
    assert plan_hanging_abort(ongoing, question, now_ms=expired_ms - 1,
                              fresh_producer_id=None) is None
    aborted = plan_hanging_abort(ongoing, question, now_ms=expired_ms, fresh_producer_id=None)
    assert aborted is not None
    # The timeout path: a decided abort with an epoch bump that fences the
    # producer, to the partitions it had and the store's.
    assert (aborted.state, aborted.producer_epoch, aborted.bump_reason) == (
        txn.TxnState.PREPARE_ABORT, 1, "timeout")
    assert aborted.partitions == {TP, ("ledger", 0)}
    assert (aborted.marker_producer_id, aborted.marker_producer_epoch,
            aborted.decided_producer_epoch) == (PID, 1, 0)
    # Two-phase commit never times out.
    held = LIVES["2pc"]["ongoing"]
    assert plan_hanging_abort(held, StoreQuestion(PID, 0, TP), now_ms=10**12,
                              fresh_producer_id=None) is None


def test_the_marker_sent_again_is_the_decisions() -> None:
    v2 = decided_marker(LIVES["v2"]["complete_commit"])
    assert (v2.producer_id, v2.producer_epoch, v2.commit, v2.timestamp_ms) == (PID, 1, True, 0)
    v1 = decided_marker(LIVES["v1"]["complete_commit"])
    assert (v1.producer_id, v1.producer_epoch, v1.commit, v1.timestamp_ms) == (
        PID, 0, True, DECISION_TS)
    assert v1.transaction_version is V1
    aborted = decided_marker(LIVES["v1"]["timeout_abort"])
    assert (aborted.producer_epoch, aborted.commit) == (1, False)
    rotated = decided_marker(LIVES["exhausted"]["rotated_commit"])
    assert (rotated.producer_id, rotated.producer_epoch) == (PID, E_MAX + 1)


def test_an_expired_id_and_no_ids_know_nothing() -> None:
    dead = replace(LIVES["v2"]["complete_commit"], state=txn.TxnState.DEAD)
    assert fate_of(dead, StoreQuestion(PID, 0, TP), NOW_MS) is None
    assert answer([], StoreQuestion(PID, 0, TP), NOW_MS).fate is TxnFate.UNKNOWN


# ------------------------------------------------------------ the store's side


def _expected(fates: tuple[TxnFate | None, ...]) -> Resolution:
    """The table of core/hanging_txns.py, row by row."""
    present = set(fates)
    if TxnFate.DECIDED_COMMIT in present:
        return Resolution.COORDINATOR_COMMITS
    if TxnFate.ONGOING in present or TxnFate.HELD_OPEN in present:
        return Resolution.WAIT_OPEN
    if TxnFate.ABORTING in present or TxnFate.DECIDED_ABORT in present:
        return Resolution.COORDINATOR_ABORTS
    if all(f is TxnFate.UNKNOWN for f in fates):
        return Resolution.STORE_ABORTS
    return Resolution.WAIT_FOR_ANSWERS


ANSWERS = [None, *TxnFate]


@pytest.mark.parametrize("fates", list(itertools.product(ANSWERS, ANSWERS)),
                         ids=lambda fates: "-".join(f.name if f else "none" for f in fates))
def test_every_combination_of_two_partitions_answers(fates: tuple[TxnFate | None, ...]) -> None:
    answers = {p: f for p, f in enumerate(fates) if f is not None}
    resolution = decide(answers, partitions=2)
    assert resolution is _expected(fates)
    # The store acts alone only when every partition answered that nobody knows it.
    assert (resolution is Resolution.STORE_ABORTS) == (fates == (TxnFate.UNKNOWN,) * 2)


def test_a_partition_that_did_not_answer_holds_the_store_back() -> None:
    assert decide({0: TxnFate.UNKNOWN, 1: TxnFate.UNKNOWN}, partitions=3) is \
        Resolution.WAIT_FOR_ANSWERS
    # An answer for a partition the layout does not have counts for nothing.
    assert decide({1: TxnFate.UNKNOWN, 2: TxnFate.UNKNOWN}, partitions=2) is \
        Resolution.WAIT_FOR_ANSWERS
    assert decide({0: TxnFate.UNKNOWN}, partitions=1) is Resolution.STORE_ABORTS


def test_a_transaction_is_overdue_past_its_timeout_or_the_bound_plus_the_margin() -> None:
    policy = HangingPolicy(max_transaction_timeout_ms=900_000, margin_ms=5_000)
    learned = OpenTxn(PID, 0, 40, start_time_ms=1_000, timeout_ms=10_000)
    unknown = replace(learned, timeout_ms=None)
    assert policy.overdue_at_ms(learned) == 1_000 + 10_000 + 5_000
    assert policy.overdue_at_ms(unknown) == 1_000 + 900_000 + 5_000
    assert policy.retry_ms == 5_000
    assert HangingPolicy(max_transaction_timeout_ms=1, margin_ms=0).retry_ms == 1_000


def test_open_transactions_name_their_epoch_and_the_last_marker_at_it() -> None:
    table = ProducerStateManager("payments-3")
    table.replay_marker(TxnMarker(PID, 0, MARKER_COMMIT, 2, transaction_version=1,
                                  timestamp_ms=4_000), 10, 1_000)
    table.replay(read_header(_batch(PID, 0)), 11, 2_000)          # version 1: same epoch
    table.replay(read_header(_batch(OTHER_PID, 3)), 12, 3_000)
    found = open_transactions(table.open_entries(), {PID: 10_000})
    assert found == [
        OpenTxn(PID, 0, 11, 2_000, 10_000, last_marker_timestamp_ms=4_000),
        OpenTxn(OTHER_PID, 3, 12, 3_000, None, last_marker_timestamp_ms=NO_TIME_MS),
    ]


# ----------------------------------------------------- the store's own marker


def _batch(producer_id: int, epoch: int, sequence: int = 0) -> bytes:
    return encode_batch([(None, b"v", None, 1_000)], producer_id=producer_id,
                        producer_epoch=epoch, base_sequence=sequence, transactional=True)


def _hanging(epoch: int = 4, coordinator_epoch: int = 6) -> tuple[ProducerStateManager, OpenTxn]:
    """A producer whose transaction at `epoch` is open from offset 1, after a
    marker of a coordinator at `coordinator_epoch`."""
    table = ProducerStateManager("payments-3")
    table.replay_marker(TxnMarker(PID, epoch, MARKER_COMMIT, coordinator_epoch), 0, 1_000)
    table.replay(read_header(_batch(PID, epoch)), 1, 2_000)
    [open_txn] = open_transactions(table.open_entries(), {})
    return table, open_txn


def _entry(table: ProducerStateManager) -> ProducerEntry:
    entry = table.get(PID)
    assert entry is not None
    return entry


def test_the_store_aborts_with_the_next_epoch_and_the_coordinator_epoch_it_has() -> None:
    table, open_txn = _hanging()
    marker = store_abort_marker(_entry(table), open_txn)
    assert marker == TxnMarker(PID, 5, MARKER_ABORT, 6, transaction_version=2,
                               timestamp_ms=STORE_ABORT_TIMESTAMP_MS)
    assert isinstance(table.check_marker(marker), WriteMarker)   # the normal marker rules
    completed = table.replay_marker(marker, 2, 3_000)
    assert completed is not None and completed.aborted and completed.first_offset == 1
    assert table.open_txn_count == 0
    # Not twice: the transaction is no longer open as it was.
    again = store_abort_marker(_entry(table), open_txn)
    assert isinstance(again, Rejection) and again.code is ErrorCode.INVALID_TXN_STATE


def test_no_epoch_left_above_the_last_one_leaves_it_to_an_operator() -> None:
    table, open_txn = _hanging(epoch=MAX_PRODUCER_EPOCH)
    refused = store_abort_marker(_entry(table), open_txn)
    assert isinstance(refused, Rejection) and refused.code is ErrorCode.INVALID_PRODUCER_EPOCH


def _after_store_abort() -> ProducerStateManager:
    table, open_txn = _hanging()
    marker = store_abort_marker(_entry(table), open_txn)
    assert isinstance(marker, TxnMarker)
    table.replay_marker(marker, 2, 3_000)
    return table


def test_after_the_store_abort_the_zombies_late_batch_is_fenced() -> None:
    table = _after_store_abort()
    late = table.check_append(read_header(_batch(PID, 4, sequence=1)), txn_verified=True)
    assert isinstance(late, Rejection) and late.code is ErrorCode.PRODUCER_FENCED


def test_after_the_store_abort_the_producers_next_transaction_starts() -> None:
    table = _after_store_abort()
    assert isinstance(table.check_append(read_header(_batch(PID, 5))), NeedsVerification)


@pytest.mark.parametrize(("marker", "accepted"), [
    # Version 2: a later transaction's marker is above its data's epoch (>= 5).
    (TxnMarker(PID, 6, MARKER_COMMIT, 6), True),
    (TxnMarker(PID, 6, MARKER_COMMIT, 9), True),            # a newer coordinator
    # A commit at 5 could only end data below 5, which is fenced here.
    (TxnMarker(PID, 5, MARKER_COMMIT, 6), False),
    # Version 1 at the bumped epoch, with any decision timestamp above 0: a
    # store clock stamped there could be above a lagging coordinator's.
    (TxnMarker(PID, 5, MARKER_COMMIT, 6, transaction_version=1, timestamp_ms=1), True),
    (TxnMarker(PID, 5, MARKER_ABORT, 6, transaction_version=1, timestamp_ms=1), True),
    # A zombie coordinator stays fenced, as it was before.
    (TxnMarker(PID, 6, MARKER_COMMIT, 5), False),
])
def test_after_the_store_abort_a_real_coordinators_markers_are_judged_as_before(
        marker: TxnMarker, accepted: bool) -> None:
    decision = _after_store_abort().check_marker(marker)
    assert isinstance(decision, WriteMarker) is accepted, decision
