"""The exactly-once checker of the real-runtime simulation.

Goal: say whether a run kept the guarantees (Jepsen's list for Kafka: lost
write, duplicate, aborted read, torn transaction, non-monotonic offsets,
read of uncommitted data, offset committed past unprocessed input), without
trusting the code under test. It never asks a runtime what it believes (no
coordinator state, no producer state; the one exception is the final
comparison of the group coordinator's OffsetFetch answer with what the
durable log says); it knows what the clients did and were told — which
records each transaction wrote, with which producer id and epoch, whether
its producer asked to commit, what EndTxn and CompleteTransaction answered
— and what the stores hold: every data partition read from offset 0 under
read_committed through the store runtime's real fetch path, and every
partition's durable log (read_uncommitted, markers included), the
transaction log and `__consumer_offsets` among them, read and judged
independently.

Method: every record's value names its transaction and place
(`tid|instance|txn|partition|index`, and a copier's output adds the input
record it copies), so a read maps back to the ledger; so does a copier's
committed offset, whose metadata names its transaction. `TxnLogView`
replays the durable transaction log record by record into its own model of
the decisions (Prepare* records): which marker (producer id, epoch) commits
or aborts, and which data (producer id, epoch) each marker ends.

Transaction version 1 (Kafka's clients): a producer's transactions share
its epoch, so its markers and data do not name their transaction. Its
decisions are kept in log order per producer id, and on each partition the
producer's version-1 markers must be exactly its version-1 decisions that
include the partition, in that order, each with its decision's epoch,
outcome and timestamp (a delayed marker of an earlier transaction, or a
lost one, breaks the sequence; a marker repeated once the store forgot the
idle producer is harmless if it ends nothing); the data batches a marker
ends must all belong to one client transaction, which no other decision
ends, on any partition.

After every N steps, on each data partition whose store is up:
* no record appears twice, and offsets strictly increase;
* no record is visible unless its producer asked to commit its transaction
  (no aborted read, no read of an undecided transaction), and none of a
  transaction whose abort was acknowledged;
* what was visible stays visible at the same offset (no acknowledged,
  committed write is lost by a crash, nothing is rewritten);
* a transaction's records on a partition are visible in the order written,
  without gaps (the rest may still be above the last stable offset);
* the durable log, read on its own: no gap, it ends at the HW, LSO <= HW <=
  LEO; every COMMIT/ABORT marker matches a decision in the transaction log
  and commits only the data that decision ended (never another
  transaction's batch, never a batch of a fenced producer); every record is
  under the producer id and epoch its transaction wrote with; the LSO is the
  first open batch's offset (or the HW), and read_committed returns exactly
  the committed records below it, never a control batch, ending at the LSO;
* from the transaction log: no data decided both ways, no two-phase-commit
  transaction aborted on its timeout, every EndTxn answered with success
  matches the decision for its data (and names the bumped epoch, or a
  rotated producer id at epoch exhaustion; version 1: the same producer id
  and epoch), every CompleteTransaction's
  `committed` matches the decision for the prepared state (unless a newer
  transaction was prepared since), no commit decided for a transaction its
  client never asked to commit;
* no client got an OUT_OF_ORDER_SEQUENCE_NUMBER it cannot explain (every
  earlier batch acknowledged and its transaction open in the log: lost
  deduplication state), reported by the workload through the ledger;
* the read-process-write workload (`GroupChecker`): see its docstring.

At the end, after quiescing (faults off, every node up, producers done,
timers run): every transaction is visible whole or not at all, on every
partition together (no torn transaction); every transaction whose commit
was acknowledged is visible whole (no lost write); no partition has an open
transaction (LSO = HW = LEO); every answer above matches the log; no
runtime task died of an exception that is not an expected error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from oncelog import records
from services.common.kernel import durable
from services.common.metadata.cluster import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    ClusterLayout,
)
from services.coordinator.core import transactions as txn
from services.coordinator.core.txn_log import TXN_KEY_PREFIX, TxnPartitionState
from services.group_coordinator.runtime import GroupCoordinatorRuntime
from services.partition_store.api import FetchItem, FetchOutcome
from services.partition_store.core.replicas import PartitionState
from services.partition_store.log.partition import Isolation, PartitionRuntime
from services.partition_store.runtime import StoreRuntime

T = TypeVar("T")

TxnKey = tuple[str, int, int]  # (transactional id, producer instance, txn number)


class Violation(AssertionError):
    """An exactly-once guarantee does not hold."""


@dataclass(slots=True)
class TxnFacts:
    """What the client side knows of one transaction."""

    key: TxnKey
    # partition -> values written to it (assigned to a batch), in order
    values: dict[int, list[bytes]] = field(default_factory=dict)
    commit_sent: bool = False
    # True/False once EndTxn(commit/abort) was answered with success.
    outcome: bool | None = None
    # The error code that refused EndTxn(commit) on its only attempt ("":
    # not refused so): nothing else can commit the transaction.
    commit_refused: str = ""
    # The topic its records went to.
    topic: str = ""
    # (producer id, epoch) its data carries ((-1, -1): not known yet).
    producer: tuple[int, int] = (-1, -1)
    # A copier's transaction: input partition -> (first, end) offsets of the
    # input it processed, and whether it sent those ends as the group's
    # offsets (TxnOffsetCommit answered or not).
    inputs: dict[int, tuple[int, int]] = field(default_factory=dict)
    offsets_sent: bool = False
    # EndTxn answered with success: (commit?, the producer id and epoch
    # it answered).
    end_answer: tuple[bool, int, int] | None = None
    # The transaction version its producer spoke (1: Kafka's clients).
    version: int = 2

    def may_commit(self) -> bool:
        """Whether the transaction may have committed, by what its client
        did and was told."""
        return self.commit_sent and self.outcome is not False and not self.commit_refused


def record_value(key: TxnKey, partition: int, index: int) -> bytes:
    tid, instance, number = key
    return f"{tid}|{instance}|{number}|{partition}|{index}".encode()


def offsets_metadata(key: TxnKey) -> str:
    """The metadata a copier commits its input offsets with: its
    transaction, so that the checker maps a committed offset to it."""
    return "|".join(map(str, key))


def parse_offsets_metadata(metadata: str) -> TxnKey | None:
    fields = metadata.split("|")
    if len(fields) != 3:
        return None
    return fields[0], int(fields[1]), int(fields[2])


def parse_value(value: bytes) -> tuple[TxnKey, int]:
    """The transaction and partition a record was written by and to (a
    copier's output value carries the input record after these fields)."""
    tid, instance, number, partition, _index = value.decode().split("|")[:5]
    return (tid, int(instance), int(number)), int(partition)


class Ledger:
    def __init__(self) -> None:
        self.txns: dict[TxnKey, TxnFacts] = {}
        # CompleteTransaction answers: (transactional id, prepared state,
        # committed?), checked against the log once it is readable.
        self.completions: list[tuple[str, tuple[int, int], bool]] = []
        # What a client saw that must not happen (an OUT_OF_ORDER_SEQUENCE_NUMBER
        # it cannot explain), raised by the next check.
        self.violations: list[str] = []


    def begin(self, key: TxnKey, topic: str = "") -> TxnFacts:
        facts = TxnFacts(key, topic=topic)
        self.txns[key] = facts
        return facts


@dataclass(frozen=True, slots=True)
class V1Decision:
    """A version-1 decision of the transaction log: the `index`-th of its
    markers' producer id, their epoch, outcome and timestamp (their control
    batches'), the partitions they go to, and the data (producer id, epoch)
    the transaction wrote with."""

    transactional_id: str
    index: int
    epoch: int
    commit: bool
    timestamp_ms: int
    partitions: frozenset[tuple[str, int]]
    data: tuple[int, int]

    def marks(self, epoch: int, commit: bool, timestamp_ms: int) -> bool:
        """Whether a marker with these is this decision's."""
        return (self.epoch, self.commit, self.timestamp_ms) == (epoch, commit, timestamp_ms)


class TxnLogView:
    """The decisions in the durable transaction log, read independently.

    Every `__transaction_state` partition is read (through the store's
    fetch, read_uncommitted, up to the high watermark: what is durable) and
    each new record replayed on its own; the view keeps, per transactional
    id, its newest record, and every decision (a Prepare* record): the
    (producer id, epoch) its markers carry -> commit?, and the data
    (producer id, epoch) each marker ends: the epoch just below the
    marker's, or the prepared state of a two-phase-commit transaction that
    a new instance kept. It checks, as records arrive, that no data is
    decided both ways and that no two-phase-commit transaction is aborted
    on its timeout. Version-1 decisions share their (producer id, epoch)
    with the producer's other transactions: they are kept apart, in log
    order per marker producer id (`v1_decisions`)."""

    def __init__(self, partitions: int, store_for: Callable[[str, int], StoreRuntime | None],
                 *, replicated: bool = False) -> None:
        self._partitions = partitions
        self._store_for = store_for
        # Replicated: a new leader's HW may lag what the old one had already
        # acknowledged (until its followers fetch), so a read up to it is
        # whole only when nothing lies between its HW and its log end.
        self._replicated = replicated
        self._read_to = [0] * partitions
        self.decisions: dict[tuple[int, int], bool] = {}
        self.decisions_by_data: dict[tuple[int, int], bool] = {}
        self.data_of_marker: dict[tuple[int, int], tuple[int, int]] = {}
        self.last_record: dict[str, txn.TxnMetadata] = {}
        self.last_prepared: dict[str, tuple[int, int]] = {}
        # marker producer id -> its version-1 decisions, in log order.
        self.v1_decisions: dict[int, list[V1Decision]] = {}

    def v1_including(self, producer_id: int, tp: tuple[str, int]) -> list[V1Decision]:
        """The producer id's version-1 decisions whose markers go to `tp`."""
        return [d for d in self.v1_decisions.get(producer_id, []) if tp in d.partitions]

    def refresh(self) -> bool:
        """Reads what is new; False when a partition's store is down."""
        complete = True
        for partition in range(self._partitions):
            store = self._store_for(TRANSACTION_STATE_TOPIC, partition)
            if store is None or not store.started:
                complete = False
                continue
            while True:
                offset = self._read_to[partition]
                outcomes = run_now(store.fetch(
                    [FetchItem(TRANSACTION_STATE_TOPIC, partition, offset, 1 << 20)],
                    isolation=Isolation.READ_UNCOMMITTED))
                if outcomes is None or outcomes[0].error is not None:
                    complete = False
                    break
                (outcome,) = outcomes
                for batch in outcome.batches:
                    for record in records.iter_records(batch, min_offset=offset):
                        self._replay(record.key, record.value)
                if outcome.next_fetch_offset <= offset or not outcome.batches:
                    if self._replicated and outcome.high_watermark < store.partition(
                            TRANSACTION_STATE_TOPIC, partition).log.log_end_offset:
                        complete = False
                    break
                self._read_to[partition] = outcome.next_fetch_offset
        return complete

    def _replay(self, key: bytes | None, value: bytes | None) -> None:
        scratch = TxnPartitionState()
        scratch.replay(key, value)
        if value is None and key is not None and key.startswith(TXN_KEY_PREFIX):
            self.last_record.pop(key[len(TXN_KEY_PREFIX):].decode(), None)  # expired
        for md in scratch.transactions.values():
            previous = self.last_record.get(md.transactional_id)
            self.last_record[md.transactional_id] = md
            if md.state is txn.TxnState.PREPARED and md.prepared_state is not None:
                self.last_prepared[md.transactional_id] = md.prepared_state
            if not md.state.is_prepare:
                continue
            target = txn.marker_target(md)
            commit = md.state is txn.TxnState.PREPARE_COMMIT
            if md.transaction_version is txn.TransactionVersion.V1:
                # The data's id and epoch are the open transaction's (the
                # marker's, or one below it after a fence's bump).
                data = (previous.producer_id, previous.producer_epoch) \
                    if previous is not None else target
                decided = self.v1_decisions.setdefault(target[0], [])
                decided.append(V1Decision(md.transactional_id, len(decided), target[1], commit,
                                          md.decision_timestamp_ms, md.partitions, data))
                continue
            if previous is not None and previous.state is txn.TxnState.PREPARED \
                    and previous.prepared_state is not None:
                data = previous.prepared_state
            else:
                data = (target[0], target[1] - 1)
            if previous is not None and previous.two_phase_commit and md.bump_reason == "timeout":
                raise Violation(f"the two-phase-commit transaction of {md.transactional_id} "
                                f"(data {data}) was aborted on its timeout")
            if self.decisions_by_data.get(data, commit) != commit:
                raise Violation(f"the transaction log decided the data of producer {data[0]} "
                                f"epoch {data[1]} both ways")
            if self.decisions.get(target, commit) != commit:
                raise Violation(f"the transaction log decided marker {target} both ways")
            self.decisions_by_data[data] = commit
            self.decisions[target] = commit
            self.data_of_marker[target] = data

    def open_txn(self, transactional_id: str, producer: tuple[int, int]) -> bool:
        """Whether the log holds an open transaction of that producer."""
        md = self.last_record.get(transactional_id)
        return (md is not None and (md.producer_id, md.producer_epoch) == producer
                and md.state is txn.TxnState.ONGOING)


def decision_name(decided: bool | None) -> str:
    return "no decision" if decided is None else ("commit" if decided else "abort")


@dataclass(slots=True)
class Seen:
    offset: int
    value: bytes


def run_now(coro: Coroutine[Any, Any, T]) -> T | None:
    """Runs a coroutine that completes without suspending (a fetch with
    max_wait_ms 0 of a known topic) to its end, outside the loop's
    schedule; None if it would have to wait."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    return None


class Checker:
    def __init__(self, ledger: Ledger, topic: str, partitions: int,
                 store_of: Callable[[int], StoreRuntime | None],
                 txn_log: TxnLogView | None = None, *, replicated: bool = False) -> None:
        self._ledger = ledger
        # Replicated partitions: a new leader starts at the high watermark
        # it had as a follower, which may lag the old leader's until its
        # followers fetch (Kafka's too), so a read may for a while end
        # earlier than one before it; it must never disagree with it.
        self._replicated = replicated
        self._topic = topic
        self._partitions = partitions
        self._store_of = store_of
        self._txn_log = txn_log
        self._parsed: dict[bytes, tuple[records.BatchHeader, tuple[int, int] | None,
                                        list[tuple[int, bytes]]]] = {}
        # partition -> (its log's state, the read_committed view then,
        # whether the durable log was judged whole, the last fetch outcome).
        self._last_read: dict[int, tuple[tuple[int, int, int, int], list[Seen], bool,
                                         FetchOutcome]] = {}
        # partition -> the read_committed view at the last check
        self._seen: dict[int, list[Seen]] = {}
        # partition -> client transaction -> the version-1 decision that
        # ended its batches there: (marker producer id, index, commit?).
        self._v1_ended: dict[int, dict[TxnKey, tuple[int, int, bool]]] = {}
        self.checks = 0

    def read_committed(self, partition: int) -> tuple[list[Seen], FetchOutcome] | None:
        """Every record visible under read_committed, from offset 0, through
        StoreRuntime.fetch; None when the store is down or still starting."""
        store = self._store_of(partition)
        if store is None or not store.started:
            return None
        out: list[Seen] = []
        offset = 0
        while True:
            outcomes = run_now(store.fetch(
                [FetchItem(self._topic, partition, offset, 1 << 20)],
                isolation=Isolation.READ_COMMITTED,
            ))
            if outcomes is None:
                return None
            (outcome,) = outcomes
            if outcome.error is not None:
                return None
            for batch in outcome.batches:
                header = records.read_header(batch)
                if header.is_control:
                    raise Violation(f"{self._topic}-{partition}: read_committed returned a "
                                    f"control batch at {header.base_offset}")
                out.extend(Seen(r.offset, r.value or b"")
                           for r in records.iter_records(batch, min_offset=offset))
            if outcome.next_fetch_offset <= offset or not outcome.batches:
                if outcome.next_fetch_offset != outcome.last_stable_offset:
                    raise Violation(f"{self._topic}-{partition}: read_committed from 0 ends at "
                                    f"{outcome.next_fetch_offset}, the LSO is "
                                    f"{outcome.last_stable_offset}")
                return out, outcome
            offset = outcome.next_fetch_offset

    def check_step(self, *, log_complete: bool = False) -> None:
        """`log_complete`: the transaction log view has read every
        partition of the log just now (else a marker whose decision it has
        not read yet is not judged)."""
        self.checks += 1
        if self._ledger.violations:
            raise Violation(self._ledger.violations[0])
        for partition in range(self._partitions):
            store = self._store_of(partition)
            state = _log_state(store, self._topic, partition)
            cached = self._last_read.get(partition)
            if cached is not None and state is not None and cached[0] == state:
                # Nothing was written or decided there since: the same view,
                # judged again against what the clients know now.
                self._check_partition(partition, cached[1])
                if cached[2]:
                    continue
                view, last = cached[1], cached[3]
            else:
                read = self.read_committed(partition)
                if read is None:
                    continue
                view, last = read
                self._check_partition(partition, view)
            judged = self._check_durable(partition, view, last, log_complete=log_complete)
            if state is not None:
                self._last_read[partition] = (state, view, judged, last)
        if log_complete and self._txn_log is not None:
            self.check_answers(self._txn_log)

    def _parse(self, raw: bytes) -> tuple[records.BatchHeader, tuple[int, int] | None,
                                          list[tuple[int, bytes]]]:
        parsed = self._parsed.get(raw)
        if parsed is None:
            header = records.read_header(raw)
            if header.is_control:
                parsed = (header, records.control_marker(raw), [])
            else:
                parsed = (header, None, [(r.offset, r.value or b"")
                                         for r in records.iter_records(raw)])
            self._parsed[raw] = parsed
        return parsed

    def _check_durable(self, partition: int, view: list[Seen], last: FetchOutcome, *,
                       log_complete: bool) -> bool:
        """The partition's durable log (every batch, markers included) read
        on its own and judged against the transaction log's decisions: every
        marker matches a decision, and commits only the data that decision
        ended (so never a batch of a fenced producer, nor of another
        transaction); each record is under the producer id and epoch its
        transaction wrote with; the LSO is the first open batch's offset
        (or the HW), and read_committed returns exactly the committed
        records below it, in log order."""
        log = self._txn_log
        store = self._store_of(partition)
        if log is None or store is None:
            return False
        where = f"{self._topic}-{partition}"
        batches: list[bytes] = []
        offset = 0
        while True:
            outcomes = run_now(store.fetch(
                [FetchItem(self._topic, partition, offset, 1 << 20)],
                isolation=Isolation.READ_UNCOMMITTED, include_control=True))
            if outcomes is None or outcomes[0].error is not None:
                return False
            (outcome,) = outcomes
            batches.extend(outcome.batches)
            if outcome.next_fetch_offset <= offset or not outcome.batches:
                break
            offset = outcome.next_fetch_offset
        high_watermark = outcome.high_watermark
        if high_watermark != last.high_watermark:
            return False  # not the same moment (cannot happen within one step)
        state = _log_state(store, self._topic, partition)
        if state is not None and not state[2] <= high_watermark <= state[3]:
            raise Violation(f"{where}: offsets out of order: LSO {state[2]}, HW "
                            f"{high_watermark}, LEO {state[3]}")
        open_batches: dict[int, list[tuple[records.BatchHeader, list[tuple[int, bytes]]]]] = {}
        committed: list[tuple[int, bytes]] = []
        next_offset = 0
        # Version 1: producer id -> how many of its version-1 markers came
        # so far here; client transaction -> the decision that ended it here.
        v1_markers: dict[int, int] = {}
        v1_ended: dict[TxnKey, tuple[int, int, bool]] = {}
        for raw in batches:
            header, control, rows = self._parse(raw)
            if header.base_offset != next_offset:
                raise Violation(f"{where}: the log has a gap: a batch at {header.base_offset}, "
                                f"expected {next_offset}")
            next_offset = header.next_offset
            pid, epoch = header.producer_id, header.producer_epoch
            if control is not None:
                commit = control[0] == records.MARKER_COMMIT
                decided = log.decisions.get((pid, epoch))
                ended = log.data_of_marker.get((pid, epoch))
                v1: V1Decision | None = None
                if decided is None:
                    nth = v1_markers.get(pid, 0)
                    mine = log.v1_including(pid, (self._topic, partition))
                    stamp = header.max_timestamp_ms
                    if nth and mine[nth - 1].marks(epoch, commit, stamp):
                        # The last decision's marker again: written anew once
                        # the store forgot the idle producer. Harmless while
                        # it ends nothing.
                        v1 = mine[nth - 1]
                        if open_batches.get(pid):
                            raise Violation(
                                f"{where}@{header.base_offset}: a repeated marker of decision "
                                f"#{v1.index} of producer {pid} ends batches written after its "
                                "first one")
                    elif nth < len(mine):
                        v1 = mine[nth]
                        v1_markers[pid] = nth + 1
                        if not v1.marks(epoch, commit, stamp):
                            raise Violation(
                                f"{where}@{header.base_offset}: {'COMMIT' if commit else 'ABORT'}"
                                f" marker of producer {pid} epoch {epoch} at {stamp} is its "
                                f"version-1 marker #{nth} here, but its decision #{nth} that "
                                f"includes {where} is {decision_name(v1.commit)} at epoch "
                                f"{v1.epoch} at {v1.timestamp_ms} ({v1.transactional_id}; a "
                                "delayed, lost or extra marker)")
                    if v1 is not None:
                        decided, ended = commit, v1.data
                if decided is None and not log_complete:
                    return False  # the view has not read that decision yet
                if decided != commit:
                    raise Violation(f"{where}@{header.base_offset}: "
                                    f"{'COMMIT' if commit else 'ABORT'} marker of producer "
                                    f"{pid} epoch {epoch}, but the transaction log holds "
                                    f"{decision_name(decided)}")
                if v1 is not None:
                    self._end_v1(where, header.base_offset, v1, pid, commit,
                                 open_batches.get(pid, []), v1_ended)
                for data, data_rows in open_batches.pop(pid, []):
                    if not commit:
                        continue
                    if ended != (pid, data.producer_epoch):
                        raise Violation(
                            f"{where}@{data.base_offset}: batch of producer {pid} epoch "
                            f"{data.producer_epoch} committed by the marker of epoch {epoch} "
                            f"at {header.base_offset}, which ends {ended} (another "
                            "transaction's marker, or a fenced producer's batch)")
                    committed.extend(data_rows)
                continue
            if not header.is_transactional:
                raise Violation(f"{where}@{header.base_offset}: a non-transactional batch")
            for _offset, value in rows:
                facts = self._ledger.txns.get(parse_value(value)[0])
                if facts is not None and facts.producer != (pid, epoch):
                    raise Violation(f"{where}@{header.base_offset}: record {value!r} under "
                                    f"producer {pid} epoch {epoch}, but its transaction "
                                    f"wrote with {facts.producer}")
            open_batches.setdefault(pid, []).append((header, rows))
        if next_offset != high_watermark:
            raise Violation(f"{where}: the log ends at {next_offset}, the HW is "
                            f"{high_watermark}")
        first_open = min((h.base_offset for bs in open_batches.values() for h, _r in bs),
                         default=None)
        lso = high_watermark if first_open is None else min(high_watermark, first_open)
        if last.last_stable_offset != lso:
            raise Violation(f"{where}: the LSO is {last.last_stable_offset}, the durable log "
                            f"says {lso} (HW {high_watermark}, first open batch {first_open})")
        expected = [value for at, value in sorted(committed) if at < lso]
        visible = [seen.value for seen in view]
        if visible != expected:
            extra = [v for v in visible if v not in set(expected)]
            missing = [v for v in expected if v not in set(visible)]
            raise Violation(f"{where}: read_committed returned {len(visible)} records, the "
                            f"durable log says {len(expected)} are committed below the LSO "
                            f"{lso}; not committed but returned: {extra[:5]}; committed but "
                            f"not returned: {missing[:5]}")
        self._v1_ended[partition] = v1_ended
        for key, decision in v1_ended.items():
            for other, ended_there in self._v1_ended.items():
                there = ended_there.get(key)
                if there is not None and there != decision:
                    raise Violation(f"transaction {key} is ended by decision {decision[:2]} on "
                                    f"{where} and by {there[:2]} on {self._topic}-{other} "
                                    "(torn)")
        return True

    @staticmethod
    def _end_v1(where: str, marker_offset: int, decision: V1Decision, pid: int, commit: bool,
                batches: list[tuple[records.BatchHeader, list[tuple[int, bytes]]]],
                ended: dict[TxnKey, tuple[int, int, bool]]) -> None:
        """A version-1 marker ends the producer's batches since its last
        marker here: they must be one client transaction's, which no other
        decision ended here before."""
        keys = {parse_value(value)[0] for _h, rows in batches for _o, value in rows}
        if len(keys) > 1:
            raise Violation(f"{where}@{marker_offset}: the version-1 marker of producer {pid} "
                            f"(decision #{decision.index}) ends batches of several "
                            f"transactions: {sorted(keys)}")
        for key in keys:
            if key in ended and ended[key][:2] != (pid, decision.index):
                raise Violation(f"{where}@{marker_offset}: transaction {key} is ended by "
                                f"decision #{decision.index} of producer {pid} after decision "
                                f"#{ended[key][1]} ended part of it (a delayed marker of an "
                                "earlier transaction)")
            ended[key] = (pid, decision.index, commit)

    def v1_outcome(self, key: TxnKey) -> bool | None:
        """How the version-1 decision that ended the transaction's batches
        went (None: none of its batches is ended in the logs read)."""
        for ended in self._v1_ended.values():
            if key in ended:
                return ended[key][2]
        return None

    def _check_partition(self, partition: int, view: list[Seen], *,
                         final: bool = False) -> None:
        where = f"{self._topic}-{partition}"
        last_offset = -1
        by_txn: dict[TxnKey, list[bytes]] = {}
        seen_values: set[bytes] = set()
        for seen in view:
            if seen.offset <= last_offset:
                raise Violation(f"{where}: offsets not increasing: {seen.offset} after "
                                f"{last_offset}")
            last_offset = seen.offset
            if seen.value in seen_values:
                raise Violation(f"{where}: duplicate record {seen.value!r} at {seen.offset}")
            seen_values.add(seen.value)
            key, written_to = parse_value(seen.value)
            if written_to != partition:
                raise Violation(f"{where}: record {seen.value!r} was sent to partition "
                                f"{written_to}")
            facts = self._ledger.txns.get(key)
            if facts is None:
                raise Violation(f"{where}: record {seen.value!r} of no known transaction")
            if not facts.commit_sent:
                raise Violation(f"{where}: record {seen.value!r} at {seen.offset} is visible, "
                                f"but its producer never asked to commit {key} "
                                "(aborted or undecided read)")
            if facts.outcome is False:
                raise Violation(f"{where}: record {seen.value!r} at {seen.offset} is visible, "
                                f"but the abort of {key} was acknowledged")
            if facts.commit_refused:
                raise Violation(f"{where}: record {seen.value!r} at {seen.offset} is visible, "
                                f"but the commit of {key} was refused "
                                f"({facts.commit_refused}) on its only attempt (aborted read)")
            by_txn.setdefault(key, []).append(seen.value)
        for key, values in by_txn.items():
            # A prefix: the rest may lie above the last stable offset (behind
            # another transaction still open); check_final wants it whole.
            expected = self._ledger.txns[key].values.get(partition, [])
            if values != expected[:len(values)]:
                raise Violation(f"{where}: transaction {key} is visible out of order or with "
                                f"gaps: {values!r}, written {expected!r}")
        before = self._seen.get(partition, [])
        if view[:len(before)] != before:
            if self._replicated and not final and before[:len(view)] == view:
                return  # a new leader's high watermark not caught up yet
            lost = [s for s in before if s not in view]
            raise Violation(f"{where}: records once visible are gone or moved: "
                            f"{[(s.offset, s.value) for s in lost[:3]]!r}")
        self._seen[partition] = view

    def check_final(self, *, runtime_errors: list[str]) -> None:
        """After quiescing; every store must be up."""
        if runtime_errors:
            raise Violation(f"a runtime raised an unexpected exception: {runtime_errors[0]}")
        visible: dict[TxnKey, dict[int, list[bytes]]] = {}
        for partition in range(self._partitions):
            read = self.read_committed(partition)
            if read is None:
                raise Violation(f"{self._topic}-{partition}: not readable after quiescing")
            view, last = read
            self._check_partition(partition, view, final=True)
            state = _log_state(self._store_of(partition), self._topic, partition)
            if last.last_stable_offset != last.high_watermark or (
                    state is not None and state[3] != last.high_watermark):
                raise Violation(f"{self._topic}-{partition}: a transaction is still open after "
                                f"quiescing (LSO {last.last_stable_offset}, HW "
                                f"{last.high_watermark}, LEO {state and state[3]})")
            for seen in view:
                key, _p = parse_value(seen.value)
                visible.setdefault(key, {}).setdefault(partition, []).append(seen.value)
        for key, facts in self._ledger.txns.items():
            if facts.topic != self._topic:
                continue
            got = visible.get(key, {})
            written = {p: v for p, v in facts.values.items() if v}
            if got and got != written:
                raise Violation(f"transaction {key} is torn: visible on "
                                f"{sorted(got)} of its partitions {sorted(written)}")
            if facts.outcome is True and got != written:
                raise Violation(f"transaction {key}: its commit was acknowledged but "
                                f"{sum(map(len, written.values())) - sum(map(len, got.values()))}"
                                " of its records are not visible (lost write)")
        if self._txn_log is not None:
            self.check_answers(self._txn_log)

    def check_answers(self, log: TxnLogView) -> None:
        """Every EndTxn answered with success (of this checker's topic) and
        every CompleteTransaction answer matches the decision in the log."""
        for key, facts in self._ledger.txns.items():
            if facts.topic != self._topic or facts.end_answer is None:
                continue
            commit, answered_id, answered_epoch = facts.end_answer
            if facts.version == 1:
                # Version 1: the same ids back; the decision is the one that
                # ended its batches (none: it wrote nothing that landed).
                ended_as = self.v1_outcome(key)
                if (answered_id, answered_epoch) != facts.producer or \
                        ended_as not in (None, commit):
                    raise Violation(
                        f"EndTxn({'commit' if commit else 'abort'}) of {key} (version 1, "
                        f"producer {facts.producer}) answered success with ({answered_id}, "
                        f"{answered_epoch}), and the decision that ended its batches is "
                        f"{decision_name(ended_as)}")
                continue
            decided = log.decisions_by_data.get(facts.producer)
            pid, epoch = facts.producer
            answer_ok = (answered_id, answered_epoch) == (pid, epoch + 1) or (
                answered_id != pid and answered_epoch == 0
                and epoch == txn.MAX_PRODUCER_EPOCH)
            if decided != commit or not answer_ok:
                raise Violation(f"EndTxn({'commit' if commit else 'abort'}) of {key} (producer "
                                f"{pid} epoch {epoch}) answered success with ({answered_id}, "
                                f"{answered_epoch}), but the transaction log holds "
                                f"{decision_name(decided)} for its data")
        for ended in self._v1_ended.values():
            for key, (pid, index, commit) in ended.items():
                v1_facts = self._ledger.txns.get(key)
                if commit and v1_facts is not None and not v1_facts.commit_sent:
                    raise Violation(f"the transaction log's decision #{index} of producer "
                                    f"{pid} commits {key}, which its client never asked to "
                                    "commit")
        by_producer = {f.producer: f for f in self._ledger.txns.values() if f.version != 1}
        for data, commit in log.decisions_by_data.items():
            decided_facts = by_producer.get(data)
            if commit and decided_facts is not None and decided_facts.topic == self._topic \
                    and not decided_facts.commit_sent:
                raise Violation(f"the transaction log decided to commit {decided_facts.key} "
                                f"(producer "
                                f"{data[0]} epoch {data[1]}), which its client never asked to "
                                "commit")
        for tid, prepared, committed in self._ledger.completions:
            decided = log.decisions_by_data.get(prepared)
            superseded = log.last_prepared.get(tid) != prepared
            if committed and decided is not True or \
                    not committed and decided is True and not superseded:
                raise Violation(f"CompleteTransaction({prepared}) of {tid} answered "
                                f"committed={committed}, but the transaction log holds "
                                f"{decision_name(decided)} for that data")


class ReplicaChecker:
    """Replication's own guarantees, judged from every replica's log
    (replicated runs): what a partition has committed is the same on
    every copy, and no copy counts as committed what its leader lacks.

    Who leads a partition, at which epoch, and who is in sync is read from
    the metadata store (`state_of`), never from a runtime; each replica's
    stored batches and offsets are read from its store node's disk through
    its partition (`replica_of`: None while the node is down or does not
    hold the partition yet). The leader counts only once its runtime leads
    at the metadata's epoch.

    After every N steps, for each partition whose leader is up: every
    replica's high watermark is at most the leader's log end (a replica
    never treats as committed what the leader does not have), and its
    batches below its high watermark are the leader's, at the same offsets
    with the same bytes (compacted topics, which every replica compacts on
    its own: the records both still hold at an offset are the same).

    At the end, after quiescing: every partition has a leader and every
    replica is in the ISR again, all end at the leader's log end with its
    high watermark, and the check above holds for the whole log of each."""

    def __init__(self, *, topics: Callable[[], dict[str, tuple[int, bool]]],
                 state_of: Callable[[str, int], PartitionState | None],
                 replica_of: Callable[[int, str, int], PartitionRuntime | None]) -> None:
        # topic -> (partitions, compacted?)
        self._topics = topics
        self._state_of = state_of
        self._replica_of = replica_of
        # (topic, partition, replica) -> what was judged, to skip it when
        # neither log has changed since.
        self._judged: dict[tuple[str, int, int], tuple[object, ...]] = {}
        self.checks = 0

    def _leader(self, topic: str, partition: int) -> tuple[PartitionState,
                                                           PartitionRuntime] | None:
        state = self._state_of(topic, partition)
        if state is None or not state.online:
            return None
        leader = self._replica_of(state.leader, topic, partition)
        if leader is None or not leader.is_leader or \
                leader.state.leader_epoch != state.leader_epoch:
            return None
        return state, leader

    def check_step(self) -> None:
        self.checks += 1
        for topic, (partitions, compacted) in sorted(self._topics().items()):
            for partition in range(partitions):
                found = self._leader(topic, partition)
                if found is None:
                    continue
                state, leader = found
                for replica in state.replicas:
                    if replica == state.leader:
                        continue
                    follower = self._replica_of(replica, topic, partition)
                    if follower is not None:
                        self._compare(topic, partition, replica, leader, follower,
                                      compacted=compacted)

    def _compare(self, topic: str, partition: int, replica: int, leader: PartitionRuntime,
                 follower: PartitionRuntime, *, compacted: bool) -> None:
        where = f"{topic}-{partition}"
        hw, leader_end = follower.log.high_watermark, leader.log.log_end_offset
        if hw > leader_end:
            raise Violation(f"{where}: store {replica}'s high watermark is {hw}, beyond the log "
                            f"end {leader_end} of the leader (store {leader.node_id}, epoch "
                            f"{leader.state.leader_epoch}): it counts as committed records "
                            "the leader does not have")
        # Judged already with both logs as they are (compaction only takes
        # records away, which cannot make two replicas disagree).
        key = (topic, partition, replica)
        judged = (id(leader.log), id(follower.log), hw, leader_end,
                  leader.log.log_start_offset, follower.log.log_start_offset)
        if self._judged.get(key) == judged:
            return
        mine = list(follower.read_stored(follower.log.log_start_offset, hw))
        theirs = list(leader.read_stored(follower.log.log_start_offset, hw))
        if compacted:
            _same_records(where, replica, leader.node_id, mine, theirs, hw)
        else:
            _same_batches(where, replica, leader.node_id, mine, theirs, hw)
        self._judged[key] = judged

    def check_final(self) -> None:
        """After quiescing (every store up, a perfect network)."""
        for topic, (partitions, compacted) in sorted(self._topics().items()):
            for partition in range(partitions):
                where = f"{topic}-{partition}"
                found = self._leader(topic, partition)
                if found is None:
                    raise Violation(f"{where}: no leader after quiescing "
                                    f"({self._state_of(topic, partition)})")
                state, leader = found
                if set(state.isr) != set(state.replicas):
                    raise Violation(f"{where}: ISR {list(state.isr)} of replicas "
                                    f"{list(state.replicas)} after quiescing")
                end, hw = leader.log.log_end_offset, leader.log.high_watermark
                if hw != end:
                    raise Violation(f"{where}: the leader's HW {hw} is not its log end {end} "
                                    "after quiescing")
                for replica in state.replicas:
                    if replica == state.leader:
                        continue
                    follower = self._replica_of(replica, topic, partition)
                    if follower is None:
                        raise Violation(f"{where}: store {replica} holds no replica after "
                                        "quiescing")
                    if (follower.log.log_end_offset, follower.log.high_watermark) != (end, hw):
                        raise Violation(
                            f"{where}: store {replica} ends at {follower.log.log_end_offset} "
                            f"(HW {follower.log.high_watermark}), the leader (store "
                            f"{state.leader}) at {end} (HW {hw}) after quiescing")
                    self._judged.pop((topic, partition, replica), None)
                    self._compare(topic, partition, replica, leader, follower,
                                  compacted=compacted)


def _same_batches(where: str, replica: int, leader: int,
                  mine: list[tuple[records.BatchHeader, bytes]],
                  theirs: list[tuple[records.BatchHeader, bytes]], upper: int) -> None:
    """The follower's batches below `upper` are the leader's, byte for byte."""
    for (h1, b1), (h2, b2) in zip(mine, theirs, strict=False):
        if h1.base_offset != h2.base_offset or b1 != b2:
            raise Violation(
                f"{where}: below the high watermark {upper}, store {replica} holds a batch at "
                f"{h1.base_offset} (producer {h1.producer_id} epoch {h1.producer_epoch}, leader "
                f"epoch {h1.partition_leader_epoch}, {len(b1)} bytes) where the leader (store "
                f"{leader}) holds one at {h2.base_offset} (producer {h2.producer_id} epoch "
                f"{h2.producer_epoch}, leader epoch {h2.partition_leader_epoch}, {len(b2)} "
                "bytes): the replicas diverged")
    if len(mine) != len(theirs):
        longer, name = (mine, f"store {replica}") if len(mine) > len(theirs) else (
            theirs, f"the leader (store {leader})")
        extra = longer[min(len(mine), len(theirs))][0]
        raise Violation(f"{where}: below the high watermark {upper}, only {name} holds the "
                        f"batch at {extra.base_offset}: the replicas diverged")


def _records_of(batches: list[tuple[records.BatchHeader, bytes]]) -> dict[int, tuple[object, ...]]:
    out: dict[int, tuple[object, ...]] = {}
    for header, raw in batches:
        ident = (header.producer_id, header.producer_epoch, header.is_transactional)
        if header.is_control:
            out[header.base_offset] = (*ident, records.control_marker(raw)[0])
            continue
        for record in records.iter_records(raw):
            out[record.offset] = (*ident, record.key, record.value)
    return out


def _same_records(where: str, replica: int, leader: int,
                  mine: list[tuple[records.BatchHeader, bytes]],
                  theirs: list[tuple[records.BatchHeader, bytes]], upper: int) -> None:
    """A compacted partition: every offset both still hold below `upper`
    holds the same record (and the same producer) on both."""
    ours, leaders = _records_of(mine), _records_of(theirs)
    for offset in sorted(ours.keys() & leaders.keys()):
        if ours[offset] != leaders[offset]:
            raise Violation(f"{where}@{offset}: below the high watermark {upper}, store "
                            f"{replica} holds {ours[offset]!r}, the leader (store {leader}) "
                            f"{leaders[offset]!r}: the replicas diverged")


def _log_state(store: StoreRuntime | None, topic: str,
               partition: int) -> tuple[int, int, int, int] | None:
    """What identifies a partition's log at one moment (no retention or
    compaction runs here): the partition object, HW, LSO and log end."""
    if store is None or not store.started:
        return None
    try:
        log = store.partition(topic, partition).log
    except Exception:
        return None
    return (id(log), log.high_watermark, log.last_stable_offset, log.log_end_offset)


def input_value(partition: int, index: int) -> bytes:
    """The copiers' input record at `index` of input partition `partition`."""
    return f"in-{partition}-{index}".encode()


def copied_input(value: bytes) -> bytes | None:
    """The input record a copier's output record copies (None: not one)."""
    fields = value.split(b"|")
    return fields[5] if len(fields) > 5 else None


@dataclass(frozen=True, slots=True)
class GroupOffset:
    """A committed offset of the group, as the durable log decides it."""

    offset: int
    log_offset: int
    producer: tuple[int, int]  # the transactional batch's (id, epoch); (-1, -1): plain
    # The transaction its metadata names (a copier's; None: none named).
    txn: TxnKey | None = None


class GroupChecker:
    """The read-process-write workload's guarantees: exactly-once from input
    to output, and the group's committed offsets against the transactions.

    The group's committed offsets are recomputed from the durable
    `__consumer_offsets` partition (every batch, markers included, read
    through the store's fetch), never asked of the group coordinator: a
    transactional offset batch of a producer becomes committed when that
    producer's next marker on the partition is a COMMIT (only over an older
    offset), and is dropped by an ABORT.

    After every N steps: each committed offset came from a transaction its
    client asked to commit (not one whose abort was acknowledged), with the
    input end that transaction processed; no committed offset passes input
    that no transaction its client asked to commit has processed (offset
    committed past unprocessed input); no input record is copied twice in
    the committed output. After quiescing: every input record below the
    committed offset is in the committed output exactly once, none above it
    (the copiers drained their input, so the offsets are the input's ends),
    and the group coordinator's own answer (OffsetFetch) is what the
    durable log says."""

    def __init__(self, ledger: Ledger, *, group_id: str, input_topic: str,
                 inputs: list[list[bytes]], output: Checker, layout: ClusterLayout,
                 store_for: Callable[[str, int], StoreRuntime | None],
                 group_coordinator: Callable[[int], GroupCoordinatorRuntime | None]) -> None:
        self._ledger = ledger
        self._group_id = group_id
        self._input_topic = input_topic
        self._inputs = inputs
        self._output = output
        self._layout = layout
        self._store_for = store_for
        self._group_coordinator = group_coordinator
        self._where = (CONSUMER_OFFSETS_TOPIC, layout.consumer_offsets_partition(group_id))
        self._cached: tuple[tuple[int, int, int, int], dict[int, GroupOffset]] | None = None

    def committed_offsets(self) -> dict[int, GroupOffset] | None:
        """Input partition -> the group's committed offset, from the durable
        log; None while the partition's store is down."""
        store = self._store_for(*self._where)
        state = _log_state(store, *self._where)
        if store is None or state is None:
            return None
        if self._cached is not None and self._cached[0] == state:
            return self._cached[1]
        committed = self._read_committed_offsets(store)
        if committed is not None:
            self._cached = (state, committed)
        return committed

    def _read_committed_offsets(self, store: StoreRuntime) -> dict[int, GroupOffset] | None:
        pending: dict[int, dict[int, GroupOffset]] = {}
        committed: dict[int, GroupOffset] = {}
        offset = 0
        while True:
            outcomes = run_now(store.fetch(
                [FetchItem(*self._where, offset, 1 << 20)],
                isolation=Isolation.READ_UNCOMMITTED, include_control=True))
            if outcomes is None:
                return None
            (outcome,) = outcomes
            if outcome.error is not None:
                return None
            for raw in outcome.batches:
                header = records.read_header(raw)
                pid = header.producer_id
                if header.is_control:
                    marker, _coordinator_epoch = records.control_marker(raw)
                    for part, value in pending.pop(pid, {}).items():
                        current = committed.get(part)
                        if marker == records.MARKER_COMMIT and (
                                current is None or current.log_offset < value.log_offset):
                            committed[part] = value
                    continue
                for record in records.iter_records(raw, min_offset=offset):
                    found = self._offset_record(record.key, record.value)
                    if found is None:
                        continue
                    part, found_offset, named = found
                    at = GroupOffset(found_offset, record.offset, (pid, header.producer_epoch)
                                     if header.is_transactional else (-1, -1), named)
                    target = (pending.setdefault(pid, {}) if header.is_transactional
                              else committed)
                    if found_offset < 0:
                        target.pop(part, None)
                    else:
                        target[part] = at
            if outcome.next_fetch_offset <= offset or not outcome.batches:
                return committed
            offset = outcome.next_fetch_offset

    def _offset_record(self, key: bytes | None, value: bytes | None
                       ) -> tuple[int, int, TxnKey | None] | None:
        """(input partition, offset; -1 for a tombstone, the transaction its
        metadata names) of an offset record of this group's input, None for
        any other record."""
        if key is None or not key.startswith(b"O"):
            return None
        group_id, topic, partition = json.loads(key[1:])
        if group_id != self._group_id or topic != self._input_topic:
            return None
        if value is None:
            return int(partition), -1, None
        payload = durable.decode(value, expected_version=1, what="an offset record")
        return (int(partition), int(payload["offset"]),
                parse_offsets_metadata(str(payload.get("metadata", ""))))

    def _txn_of(self, at: GroupOffset) -> TxnFacts | None:
        """The copier transaction that sent the offset: the one its metadata
        names (version 1's transactions share their producer id and epoch),
        else the one of its producer id and epoch."""
        if at.txn is not None:
            named = self._ledger.txns.get(at.txn)
            return named if named is not None and named.producer == at.producer else None
        for facts in self._ledger.txns.values():
            if facts.producer == at.producer and facts.inputs:
                return facts
        return None

    def check_step(self) -> None:
        if not self._inputs:
            return
        committed = self.committed_offsets()
        if committed is not None:
            self._check_offsets(committed)
        self._copied_once()

    def _check_offsets(self, committed: dict[int, GroupOffset]) -> None:
        covered: dict[int, list[tuple[int, int]]] = {}
        for facts in self._ledger.txns.values():
            if facts.may_commit():
                for part, span in facts.inputs.items():
                    covered.setdefault(part, []).append(span)
        for part, at in sorted(committed.items()):
            where = f"group {self._group_id!r} {self._input_topic}-{part}"
            sent_by = self._txn_of(at)
            if sent_by is None:
                raise Violation(f"{where}: committed offset {at.offset} (log offset "
                                f"{at.log_offset}) of producer {at.producer}, which no "
                                "copier transaction sent")
            if not sent_by.may_commit():
                raise Violation(f"{where}: committed offset {at.offset} comes from "
                                f"transaction {sent_by.key}, which its client did not commit "
                                f"(outcome {sent_by.outcome}, commit sent {sent_by.commit_sent}, "
                                f"refused {sent_by.commit_refused or '-'})")
            if sent_by.inputs.get(part, (0, -1))[1] != at.offset:
                raise Violation(f"{where}: committed offset {at.offset}, but transaction "
                                f"{sent_by.key} processed {sent_by.inputs.get(part)}")
            done = 0
            for start, end in sorted(covered.get(part, [])):
                if start <= done:
                    done = max(done, end)
            if done < at.offset:
                raise Violation(f"{where}: offset {at.offset} committed past unprocessed "
                                f"input: no transaction that may commit processed "
                                f"{self._input_topic}-{part}@{done}")

    def _copied_once(self) -> dict[bytes, int]:
        """Input record -> how often the committed output copies it."""
        counts: dict[bytes, int] = {}
        for partition, view in sorted(self._output._seen.items()):
            for seen in view:
                copied = copied_input(seen.value)
                if copied is None:
                    continue
                counts[copied] = counts.get(copied, 0) + 1
                if counts[copied] > 1:
                    raise Violation(f"input {copied!r} is copied twice in the committed output "
                                    f"(duplicate; again at output-{partition}@{seen.offset})")
        return counts

    def check_final(self) -> None:
        if not self._inputs:
            return
        committed = self.committed_offsets()
        if committed is None:
            raise Violation(f"{self._where}: not readable after quiescing")
        self._check_offsets(committed)
        counts = self._copied_once()
        for part, values in enumerate(self._inputs):
            at = committed.get(part)
            offset = at.offset if at is not None else 0
            where = f"group {self._group_id!r} {self._input_topic}-{part}"
            for index, value in enumerate(values):
                got = counts.get(value, 0)
                if index < offset and got != 1:
                    raise Violation(f"{where}: committed offset {offset}, but input "
                                    f"{value!r} is not in the committed output (lost input: "
                                    "offset committed past unprocessed input)")
                if index >= offset and got:
                    raise Violation(f"{where}: input {value!r} is in the committed output, "
                                    f"but the committed offset is {offset} (it would be "
                                    "copied again: duplicate)")
            if offset != len(values):
                raise Violation(f"{where}: committed offset {offset} after quiescing, but the "
                                f"input ends at {len(values)} (the copiers did not finish)")
        node = self._layout.group_coordinator_for_partition(self._where[1])
        runtime = self._group_coordinator(node)
        if runtime is None:
            raise Violation(f"group coordinator {node} is not up after quiescing")
        tps = [(self._input_topic, p) for p in range(len(self._inputs))]
        answered = {f.tp[1]: f.offset for f in runtime.fetch_offsets(
            group_id=self._group_id, partitions=tps, require_stable=False)}
        expected = {p: committed[p].offset if p in committed else -1
                    for p in range(len(self._inputs))}
        if answered != expected:
            raise Violation(f"group {self._group_id!r}: the group coordinator answers "
                            f"OffsetFetch with {answered}, the durable log says {expected}")


__all__ = ["Checker", "GroupChecker", "Ledger", "ReplicaChecker", "TxnFacts", "TxnKey",
           "TxnLogView", "V1Decision", "Violation", "asyncio", "copied_input", "input_value",
           "offsets_metadata", "parse_offsets_metadata", "parse_value", "record_value",
           "run_now"]
