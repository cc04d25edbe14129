"""A seeded, deterministic simulation of the transaction coordinator and the
partition stores together (STYLE.md "Testing": FoundationDB's simulator,
TigerBeetle's VOPR).

Goal: find the interleavings no hand-written test thinks of — lost and
duplicated requests, replies that arrive after a retry, stores that crash
with a group commit in flight, coordinators replaced while the old process
still runs, producers fenced while they keep writing — and check after every
step that exactly-once still holds.

Method:
* One thread, one `random.Random(seed)`, no I/O, no wall clock, no asyncio.
  The scheduler picks one action per step (deliver a message, let a producer
  act, land a group commit, let a coordinator send markers, advance the
  clock, inject a fault); the same seed replays the same run.
* The code under test is real. Each partition is held by its own store node:
  a `PartitionRuntime` (partition.py: the append and marker rules of
  core/producer_state.py, the offsets of core/log_state.py, the aborted index
  of core/txn_index.py, the read_committed filter of core/fetch_filter.py,
  snapshots and recovery) over the in-memory `MemoryStore`. What the store
  wrote to its MemoryStore is durable; the PartitionRuntime's memory and the
  write groups not yet group-committed are volatile: a crash drops them, and
  `PartitionRuntime.recover` replays the durable log. A group commit lands
  when the scheduler says so, a prefix of the queue at a time. The store's
  request handling around it (verification before a producer's first
  transactional write, the per-producer gate behind it, replies only once
  durable) mirrors runtime.py, which is asyncio code.
* The coordinators drive the pure core (core/transactions.py,
  core/txn_log.py) as txn_runtime.py does — a conditional append on the log
  end offset, then replay; reload after an uncertain write; a higher
  coordinator epoch claimed on load; markers of Prepare* transactions resumed
  after load; timed-out transactions aborted — over one transaction log (a
  list standing for a `__transaction_state` partition). txn_runtime.py is
  asyncio code with real sleeps, so its orchestration is mirrored here; each
  mirrored method names its original.
* The network is a bag of messages: any of them can be delivered next
  (reordering), dropped, duplicated, or held for a while (a heavy-tailed
  delay, long enough to outlive a transaction or two); callers time out and
  retry with the same request, as the real client re-sends the same batch
  with the same sequence and epoch.
* Faults: store crash and recovery, producer-state snapshots, coordinator
  takeover (the old process dies, or lives on as a zombie with its old
  memory), a transaction-log append that fails before or after it lands,
  paused stores and coordinators, a producer crash (a new instance re-inits
  the transactional id; the old one dies or lives on as a zombie), producers
  stalled past their transaction timeout, a client that writes to a
  partition it never added, an administrator's abort, clock jumps (idle
  producers and transactional ids expire), epochs near int16's end (the
  producer id rotates). Each seed draws its size and fault intensity.
* The checker is an independent model (`Ledger`): which records each client
  put in which transaction, which decisions the transaction log holds, and
  for each data batch whether its producer was already fenced when the store
  applied it. After every step, for every partition, `Checker` recomputes from
  the durable log alone which batches are committed, aborted or still open
  and where the LSO must be, and compares that with what the store's
  read_committed fetch (the real filter, from offset 0) returns. At the end
  the run quiesces (faults off, every message delivered, timers run) and
  every committed transaction must be visible exactly once, with no
  transaction left open anywhere.

Replay one seed (prints the last events on failure, every event with
--verbose):

    .venv/bin/python -m tests.sim.sim --seed 17
    .venv/bin/python -m tests.sim.sim --seed 17 --steps 2000 --verbose

A longer run over a range of seeds (inclusive):

    .venv/bin/python -m tests.sim.sim --seeds 1..500 [--steps 3000]

docs/testing.md says how this fits with the unit and integration tests, and
what the simulation does not model.
"""

from __future__ import annotations

import argparse
import enum
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypeVar

from oncelog.errors import ErrorCode
from oncelog.records import (
    MARKER_ABORT,
    MARKER_COMMIT,
    BatchHeader,
    control_marker,
    encode_batch,
    iter_records,
    read_header,
)
from services.common import limits
from services.common.invariants import InvariantViolation, invariant
from services.common.service_error import ServiceError
from services.coordinator.core import transactions as txn
from services.coordinator.core.txn_log import (
    TXN_KEY_PREFIX,
    TxnPartitionState,
    encode_epoch,
    encode_tombstone,
    encode_txn,
)
from services.partition_store.core.producer_state import Duplicate, DuplicateMarker, TxnMarker
from services.partition_store.core.topics import TopicRecord
from services.partition_store.partition import (
    Isolation,
    PartitionRuntime,
    VerifyFirst,
    WaitForGate,
)
from services.partition_store.storage import keys
from services.partition_store.storage.memory import MemoryStore
from services.partition_store.storage.port import WriteGroup

TOPIC = "sim"
TOPIC_ID = 7
# Timestamps start here so that no record carries a negative or zero time.
START_MS = 1_000_000
# Every request's deadline; the caller then treats it as REQUEST_TIMED_OUT.
RPC_TIMEOUT_MS = 400
# How long a client waits before re-sending after a retriable error.
CLIENT_BACKOFF_MS = 50
# txn_runtime's marker retry backoff: doubling from 20 ms up to this.
MARKER_BACKOFF_MS_MIN = 20
MARKER_BACKOFF_MS_MAX = 1000
# txn_runtime checks timeouts every TxnConfig.check_interval_ms.
TIMER_INTERVAL_MS = 200
# TxnConfig.wait_for_markers_ms: how long a request for a transactional id
# whose markers are in flight is held before it is answered anyway.
WAIT_FOR_MARKERS_MS = 5000
MAX_TXN_TIMEOUT_MS = 60_000
TXN_TIMEOUT_MS_RANGE = (1_500, 5_000)
# The stores forget idle producers, the coordinator forgets idle
# transactional ids (StoreConfig.producer_id_expiration_ms and
# TxnConfig.transactional_id_expiration_ms, a day and a week by default):
# scaled down so that rare clock jumps of minutes exercise both.
PRODUCER_ID_EXPIRATION_MS = 60_000
TRANSACTIONAL_ID_EXPIRATION_MS = 180_000
FIRST_PRODUCER_ID = 1000
# A client keeps at most this many batches in flight per partition.
MAX_IN_FLIGHT_PER_PARTITION = 3
# The quiescent phase must settle within this many steps, or the run failed
# to make progress (a liveness bug: a hanging transaction, a stuck marker).
MAX_QUIESCE_STEPS = 20_000
# How many trace lines a failure prints.
TRACE_TAIL_LINES = 80
DEFAULT_STEPS = 1000

# The client's error classes (sdk/oncelog/_transactions.py).
FATAL_CODES = frozenset({
    ErrorCode.PRODUCER_FENCED,
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
})
# Marker results after which a partition needs no more markers (txn_runtime).
MARKER_DONE = frozenset({ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})

invariant(MAX_IN_FLIGHT_PER_PARTITION <= limits.MAX_IN_FLIGHT_BATCHES,
          "the simulated client may not pipeline more than the store deduplicates")

Entry = tuple[bytes | None, bytes | None]


class SimViolation(AssertionError):
    """The checker found a broken exactly-once invariant."""


# ------------------------------------------------------------------ messages


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    call_id: int
    transactional_id: str
    partition: int
    summary: str
    batch: bytes = field(repr=False)
    # add_partitions_to_txn: the store adds the partition for the producer.
    add_partitions: bool = False


@dataclass(frozen=True, slots=True)
class ProduceReply:
    call_id: int
    code: ErrorCode
    base_offset: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class InitRequest:
    call_id: int
    transactional_id: str
    transaction_timeout_ms: int
    two_phase_commit: bool = False
    keep_prepared_txn: bool = False


@dataclass(frozen=True, slots=True)
class InitReply:
    call_id: int
    code: ErrorCode
    producer_id: int
    producer_epoch: int
    # The prepared state of a transaction kept with keep_prepared_txn.
    kept: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PrepareRequest:
    """PrepareTransaction (two-phase commit)."""

    call_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class PrepareReply:
    call_id: int
    code: ErrorCode


@dataclass(frozen=True, slots=True)
class CompleteRequest:
    """CompleteTransaction (two-phase commit)."""

    call_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    prepared: tuple[int, int]


@dataclass(frozen=True, slots=True)
class CompleteReply:
    call_id: int
    code: ErrorCode
    committed: bool
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class AddPartitionsRequest:
    call_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AddPartitionsReply:
    call_id: int
    code: ErrorCode


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    call_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class EndTxnReply:
    call_id: int
    code: ErrorCode
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class VerifyRequest:
    """AddPartitionsToTxn from a store to the coordinator: verify_only, or
    (`add`) adding the partition on the producer's behalf."""

    call_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partition: int
    add: bool = False


@dataclass(frozen=True, slots=True)
class VerifyReply:
    call_id: int
    code: ErrorCode


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    call_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partition: int


@dataclass(frozen=True, slots=True)
class MarkerReply:
    call_id: int
    code: ErrorCode


Request = ProduceRequest | InitRequest | AddPartitionsRequest | EndTxnRequest | VerifyRequest | \
    MarkerRequest | PrepareRequest | CompleteRequest
Reply = ProduceReply | InitReply | AddPartitionsReply | EndTxnReply | VerifyReply | MarkerReply | \
    PrepareReply | CompleteReply
# What EndTxn and CompleteTransaction plan (txn_runtime._DecisionPlan).
DecisionPlan = TypeVar("DecisionPlan", txn.EndPlan, txn.CompletePlan)
# Requests for a transactional id that txn_runtime holds while its markers are out.
HeldRequest = InitRequest | AddPartitionsRequest | EndTxnRequest | PrepareRequest | CompleteRequest
Payload = Request | Reply


def show(payload: object) -> str:
    """A short one-line form of a message for the trace."""
    parts = []
    for f in fields(payload):  # type: ignore[arg-type]
        if not f.repr:
            continue
        value = getattr(payload, f.name)
        if isinstance(value, ErrorCode):
            value = value.name
        parts.append(f"{f.name}={value}")
    return f"{type(payload).__name__}({' '.join(parts)})"


@dataclass(frozen=True, slots=True)
class Envelope:
    msg_id: int
    src: str
    dst: str
    payload: Payload
    # A delayed message cannot be delivered before this time.
    not_before_ms: int = 0


# -------------------------------------------------------------------- ledger


@dataclass(slots=True)
class ClientTxn:
    """What one client instance put in one transaction (keyed by producer id
    and the epoch its data carries)."""

    transactional_id: str
    instance: str
    producer_id: int
    data_epoch: int
    # record id -> the partition it was sent to, in send order.
    records: dict[bytes, int] = field(default_factory=dict)
    acked: set[bytes] = field(default_factory=set)
    commit_requested: bool = False
    # "commit" / "abort" once an EndTxn was answered with success.
    client_outcome: str = ""


@dataclass(frozen=True, slots=True)
class AppendFact:
    """What the model knew when a store applied a data batch."""

    transactional_id: str
    fenced: bool
    why: str


class Ledger:
    """The independent model of what must be true: client transactions and
    their records, the decisions the transaction log holds, and the facts
    about every data batch a store applied. Filled by observation of
    requests, replies and durable writes — never by asking the code under
    test what it thinks."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.txns: dict[tuple[int, int], ClientTxn] = {}
        # record id -> (producer id, data epoch) of the transaction it was sent in.
        self.owner: dict[bytes, tuple[int, int]] = {}
        # (producer id, marker epoch) -> commit? — from the Prepare* records
        # that landed in the transaction log (the decision is durable there).
        self.decisions: dict[tuple[int, int], bool] = {}
        # The same decisions keyed by the (producer id, epoch) of the data
        # they end, and the data each marker ends: the epoch just below the
        # marker's, except for a two-phase-commit transaction that a new
        # instance kept (its data carries the prepared state).
        self.decisions_by_data: dict[tuple[int, int], bool] = {}
        self.data_of_marker: dict[tuple[int, int], tuple[int, int]] = {}
        # transactional id -> (producer id, epoch) of its newest durable record.
        self.current: dict[str, tuple[int, int]] = {}
        # transactional id -> its newest durable record, and the prepared
        # state of its newest Prepared record.
        self.last_record: dict[str, txn.TxnMetadata] = {}
        self.last_prepared: dict[str, tuple[int, int]] = {}
        # (partition, offset) -> facts of the data batch applied there.
        self.appended: dict[tuple[int, int], AppendFact] = {}
        self._next_record = 0

    def begin(self, transactional_id: str, instance: str, producer_id: int,
              epoch: int) -> ClientTxn:
        key = (producer_id, epoch)
        existing = self.txns.get(key)
        # A transaction that ended locally with nothing in it leaves its
        # (producer id, epoch) free for the next one.
        invariant(existing is None or not existing.records,
                  lambda: f"harness: two client transactions with data at {key}")
        record = ClientTxn(transactional_id, instance, producer_id, epoch)
        self.txns[key] = record
        return record

    def new_record(self, record: ClientTxn, partition: int) -> bytes:
        self._next_record += 1
        record_id = f"r{self._next_record}".encode()
        record.records[record_id] = partition
        self.owner[record_id] = (record.producer_id, record.data_epoch)
        return record_id

    def on_txn_log_record(self, key: bytes | None, value: bytes | None) -> None:
        """A record landed in the transaction log (durable from now on)."""
        scratch = TxnPartitionState()
        scratch.replay(key, value)
        if value is None and key is not None and key.startswith(TXN_KEY_PREFIX):
            # The id expired: whoever inits it next starts from nothing.
            self.current.pop(key[len(TXN_KEY_PREFIX):].decode(), None)
            self.last_record.pop(key[len(TXN_KEY_PREFIX):].decode(), None)
        for md in scratch.transactions.values():
            self.current[md.transactional_id] = (md.producer_id, md.producer_epoch)
            previous = self.last_record.get(md.transactional_id)
            self.last_record[md.transactional_id] = md
            if md.state is txn.TxnState.PREPARED and md.prepared_state is not None:
                self.last_prepared[md.transactional_id] = md.prepared_state
            if not md.state.is_prepare:
                continue
            target = txn.marker_target(md)
            commit = md.state is txn.TxnState.PREPARE_COMMIT
            if previous is not None and previous.state is txn.TxnState.PREPARED:
                assert previous.prepared_state is not None
                data = previous.prepared_state
            else:
                data = self.data_of_marker.get(target, (target[0], target[1] - 1))
            if previous is not None and previous.two_phase_commit \
                    and md.bump_reason == "timeout":
                raise SimViolation(
                    f"the two-phase-commit transaction of {md.transactional_id} (data {data}) "
                    "was aborted on its timeout"
                )
            self.data_of_marker[target] = data
            if self.decisions_by_data.get(data, commit) != commit:
                raise SimViolation(f"the transaction log decided the data of pid {data[0]} "
                                   f"epoch {data[1]} both ways")
            self.decisions_by_data[data] = commit
            earlier = self.decisions.get(target)
            if earlier is not None and earlier != commit:
                raise SimViolation(
                    f"transaction log decided producer {target[0]} marker epoch {target[1]} "
                    f"both ways (first {'commit' if earlier else 'abort'}, now "
                    f"{'commit' if commit else 'abort'})"
                )
            self.decisions[target] = commit
            self._sim.log(f"  ledger: decision {'COMMIT' if commit else 'ABORT'} "
                          f"{md.transactional_id} pid={target[0]} marker_epoch={target[1]} "
                          f"partitions={sorted(p for _t, p in md.partitions)}")

    def on_data_appended(self, partition: int, offset: int, header: BatchHeader,
                         transactional_id: str) -> None:
        current = self.current.get(transactional_id)
        fenced = current is not None and (
            current[0] != header.producer_id or header.producer_epoch < current[1]
        )
        why = f"current {current}, batch ({header.producer_id}, {header.producer_epoch})"
        self.appended[(partition, offset)] = AppendFact(transactional_id, fenced, why)
        if fenced:
            self._sim.log(f"  ledger: p{partition}@{offset} applied from a FENCED producer ({why})")

    def on_store_crash(self, partition: int, durable_end: int) -> None:
        for key in [k for k in self.appended if k[0] == partition and k[1] >= durable_end]:
            del self.appended[key]

    def on_complete_answered(self, transactional_id: str, prepared: tuple[int, int],
                             committed: bool) -> None:
        """CompleteTransaction answered success. Committed: the log holds a
        commit for the prepared state's data. Not committed: it does not —
        unless that commit was decided before another transaction of the id
        was prepared (the coordinator keeps only the last prepared state, so
        completing an older one aborts the newer one instead)."""
        decided = self.decisions_by_data.get(prepared)
        superseded = self.last_prepared.get(transactional_id) != prepared
        if committed and decided is not True or \
                not committed and decided is True and not superseded:
            raise SimViolation(
                f"CompleteTransaction({prepared}) of {transactional_id} answered "
                f"committed={committed}, but the transaction log holds "
                f"{_decision_name(decided)} for that data"
            )
        record = self.txns.get(prepared)
        if record is not None and committed:
            record.client_outcome = "commit"

    def on_end_answered(self, record: ClientTxn, commit: bool, producer_id: int,
                        epoch: int) -> None:
        """EndTxn answered success: the log must hold that decision."""
        target = (record.producer_id, record.data_epoch + 1)
        decided = self.decisions.get(target)
        # The answer is the bumped epoch, or a fresh producer id at epoch 0
        # when the epoch was exhausted (the markers still go to the old id).
        answer_ok = (producer_id, epoch) == target or (
            producer_id != record.producer_id and epoch == 0
            and record.data_epoch == txn.MAX_PRODUCER_EPOCH
        )
        if decided is None or decided != commit or not answer_ok:
            raise SimViolation(
                f"EndTxn({'commit' if commit else 'abort'}) of {record.transactional_id} "
                f"(pid {record.producer_id}, epoch {record.data_epoch}) answered success "
                f"with ({producer_id}, {epoch}), but the transaction log holds "
                f"{_decision_name(decided)} for marker {target}"
            )
        record.client_outcome = "commit" if commit else "abort"


def _decision_name(decided: bool | None) -> str:
    return "no decision" if decided is None else ("commit" if decided else "abort")


# ------------------------------------------------------------------- checker


@dataclass(frozen=True, slots=True)
class StoredBatch:
    header: BatchHeader
    # (marker type, coordinator epoch) of a control batch.
    control: tuple[int, int] | None
    record_ids: tuple[bytes, ...]


class Checker:
    """Checks the exactly-once invariants against the ledger and an
    independent reading of each store's durable log."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        # Stored values never change (no retention here), so their parse is
        # cached by the value itself (bytes cache their hash).
        self._parsed: dict[bytes, StoredBatch] = {}

    def parse(self, value: bytes) -> StoredBatch:
        parsed = self._parsed.get(value)
        if parsed is None:
            header = read_header(value)
            if header.is_control:
                parsed = StoredBatch(header, control_marker(value), ())
            else:
                ids = tuple(r.value or b"" for r in iter_records(value))
                parsed = StoredBatch(header, None, ids)
            self._parsed[value] = parsed
        return parsed

    def check_step(self) -> None:
        seen: dict[bytes, int] = {}
        for store in self._sim.stores:
            for record_id in self.check_partition(store).visible:
                if record_id in seen:
                    raise SimViolation(
                        f"record {record_id!r} visible on p{seen[record_id]} and "
                        f"p{store.partition}"
                    )
                seen[record_id] = store.partition

    def check_partition(self, store: StoreNode) -> PartitionView:
        ledger, p = self._sim.ledger, store.partition
        state = store.part.log
        hw, lso, leo = state.high_watermark, state.last_stable_offset, state.log_end_offset
        if not 0 <= lso <= hw <= leo:
            raise SimViolation(f"p{p}: offsets out of order: LSO {lso}, HW {hw}, LEO {leo}")
        raw: list[StoredBatch] = []
        next_offset = 0
        for _key, value in store.durable.scan(keys.log_key(TOPIC_ID, p, 0),
                                              keys.log_key_end(TOPIC_ID, p)):
            batch = self.parse(value)
            if batch.header.base_offset != next_offset:
                raise SimViolation(f"p{p}: durable log has a gap: batch at "
                                   f"{batch.header.base_offset}, expected {next_offset}")
            raw.append(batch)
            next_offset = batch.header.next_offset
        if next_offset != hw:
            raise SimViolation(f"p{p}: durable log ends at {next_offset} but the HW is {hw}")

        # The independent reading: a producer's data batches belong to the
        # transaction that its next marker on this partition ends.
        open_batches: dict[int, list[StoredBatch]] = {}
        committed: list[StoredBatch] = []
        for batch in raw:
            header = batch.header
            pid = header.producer_id
            if batch.control is not None:
                marker_type, _coordinator_epoch = batch.control
                is_commit = marker_type == MARKER_COMMIT
                decided = ledger.decisions.get((pid, header.producer_epoch))
                if decided is None or decided != is_commit:
                    raise SimViolation(
                        f"p{p}@{header.base_offset}: {'COMMIT' if is_commit else 'ABORT'} "
                        f"marker of pid {pid} epoch {header.producer_epoch}, but the "
                        f"transaction log holds "
                        f"{_decision_name(decided)}"
                    )
                ended = ledger.data_of_marker.get((pid, header.producer_epoch))
                for data in open_batches.pop(pid, []):
                    if not is_commit:
                        continue
                    if ended != (pid, data.header.producer_epoch):
                        raise SimViolation(
                            f"p{p}@{data.header.base_offset}: batch of pid {pid} epoch "
                            f"{data.header.producer_epoch} committed by the marker of "
                            f"epoch {header.producer_epoch} at {header.base_offset} "
                            "(another transaction's marker)"
                        )
                    fact = ledger.appended.get((p, data.header.base_offset))
                    invariant(fact is not None,
                              lambda d=data: f"harness: no append fact for p{p}@"  # type: ignore[misc]
                              f"{d.header.base_offset}")
                    assert fact is not None  # for mypy; invariant() guards at runtime
                    if fact.fenced:
                        raise SimViolation(
                            f"p{p}@{data.header.base_offset}: batch of a fenced producer "
                            f"committed ({fact.why})"
                        )
                    committed.append(data)
                continue
            if not header.is_transactional:
                raise SimViolation(f"p{p}@{header.base_offset}: non-transactional batch")
            for record_id in batch.record_ids:
                if ledger.owner.get(record_id) != (pid, header.producer_epoch):
                    raise SimViolation(
                        f"p{p}@{header.base_offset}: record {record_id!r} under pid {pid} "
                        f"epoch {header.producer_epoch}, but it was sent in "
                        f"{ledger.owner.get(record_id)}"
                    )
            open_batches.setdefault(pid, []).append(batch)
        first_open = min((b.header.base_offset for bs in open_batches.values() for b in bs),
                         default=None)
        expected_lso = hw if first_open is None else min(hw, first_open)
        if lso != expected_lso:
            raise SimViolation(
                f"p{p}: LSO is {lso}, but the durable log says {expected_lso} (HW {hw}, "
                f"first open transactional batch {first_open})"
            )
        committed.sort(key=lambda b: b.header.base_offset)
        expected = [r for b in committed if b.header.base_offset < expected_lso
                    for r in b.record_ids]
        fetched = store.part.read(0, max_bytes=1 << 40, isolation=Isolation.READ_COMMITTED)
        visible: list[bytes] = []
        for value in fetched.batches:
            batch = self.parse(value)
            if batch.control is not None:
                raise SimViolation(f"p{p}: read_committed returned a control batch at "
                                   f"{batch.header.base_offset}")
            visible.extend(batch.record_ids)
        if visible != expected:
            extra = [r for r in visible if r not in set(expected)]
            missing = [r for r in expected if r not in set(visible)]
            raise SimViolation(
                f"p{p}: read_committed returned {len(visible)} records, the durable log "
                f"says {len(expected)} are committed below the LSO {lso}; not committed but "
                f"returned: {extra[:10]}; committed but not returned: {missing[:10]}; "
                f"returned {visible[:20]}, expected {expected[:20]}"
            )
        if fetched.next_fetch_offset != lso:
            raise SimViolation(f"p{p}: read_committed from 0 says next offset "
                               f"{fetched.next_fetch_offset}, the LSO is {lso}")
        return PartitionView(visible=visible, open_first_offset=first_open)

    def check_final(self) -> None:
        """At quiescence: nothing open, every committed transaction visible
        exactly once on the partitions it wrote to."""
        ledger = self._sim.ledger
        visible_at: dict[bytes, int] = {}
        for store in self._sim.stores:
            view = self.check_partition(store)
            state = store.part.log
            if view.open_first_offset is not None or state.last_stable_offset != \
                    state.high_watermark or state.high_watermark != state.log_end_offset:
                raise SimViolation(
                    f"p{store.partition}: still open at quiescence: first open batch "
                    f"{view.open_first_offset}, LSO {state.last_stable_offset}, HW "
                    f"{state.high_watermark}, LEO {state.log_end_offset} (a hanging transaction)"
                )
            for record_id in view.visible:
                visible_at[record_id] = store.partition
        expected: dict[bytes, int] = {}
        for data, commit in ledger.decisions_by_data.items():
            if not commit:
                continue
            record = ledger.txns.get(data)
            if record is None:
                raise SimViolation(f"commit decided for the data of pid {data[0]} epoch "
                                   f"{data[1]}, a transaction no client began")
            if not record.commit_requested:
                raise SimViolation(f"commit decided for {record.transactional_id} pid {data[0]} "
                                   f"epoch {record.data_epoch}, which its client never committed")
            invariant(record.acked >= set(record.records),
                      lambda r=record: f"harness: client {r.instance} committed with "  # type: ignore[misc]
                      "unacknowledged batches")
            expected.update(record.records)
        missing = sorted(r for r in expected if r not in visible_at)
        extra = sorted(r for r in visible_at if r not in expected)
        moved = sorted(r for r, p in visible_at.items() if r in expected and expected[r] != p)
        if missing or extra or moved:
            raise SimViolation(
                f"at quiescence: committed but not visible {missing[:10]} ({len(missing)}); "
                f"visible but not committed {extra[:10]} ({len(extra)}); on the wrong "
                f"partition {moved[:10]}"
            )
        for record in ledger.txns.values():
            if record.client_outcome == "commit" and \
                    not ledger.decisions_by_data.get((record.producer_id, record.data_epoch)):
                raise SimViolation(f"{record.instance}: commit acknowledged, not decided")


@dataclass(frozen=True, slots=True)
class PartitionView:
    visible: list[bytes]
    open_first_offset: int | None


# -------------------------------------------------------------- the txn log


class SimTxnLog:
    """One `__transaction_state` partition: a list with MemoryTxnLog's
    conditional append, and injectable failures that land or not."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.entries: list[Entry] = []
        # Failures for the next appends: (code, whether the records land).
        self.faults: list[tuple[ErrorCode, bool]] = []
        # Who wrote the newest coordinator-epoch record: the partition's owner.
        self.epoch_writer = ""

    def read_all(self) -> tuple[list[Entry], int]:
        return list(self.entries), len(self.entries)

    def log_end_offset(self) -> int:
        return len(self.entries)

    def append(self, entries: list[Entry], *, expected_log_end_offset: int, writer: str) -> int:
        if expected_log_end_offset != len(self.entries):
            self._sim.log(f"  txn-log: {writer} append refused: log ends at "
                          f"{len(self.entries)}, expected {expected_log_end_offset}")
            raise ServiceError(
                ErrorCode.LOG_END_OFFSET_MISMATCH,
                f"log ends at {len(self.entries)}, expected {expected_log_end_offset}",
            )
        if self.faults:
            code, landed = self.faults.pop(0)
            if landed:
                self._land(entries, writer)
            self._sim.log(f"  txn-log: {writer} append fails with {code.name} "
                          f"({'landed' if landed else 'not landed'})")
            raise ServiceError(code, "injected transaction log failure")
        self._land(entries, writer)
        return len(self.entries)

    def _land(self, entries: list[Entry], writer: str) -> None:
        for key, value in entries:
            self.entries.append((key, value))
            if key == b"E":
                self.epoch_writer = writer
            self._sim.log(f"  txn-log[{len(self.entries) - 1}] by {writer}: "
                          f"{describe_txn_record(key, value)}")
            self._sim.ledger.on_txn_log_record(key, value)


def describe_txn_record(key: bytes | None, value: bytes | None) -> str:
    scratch = TxnPartitionState()
    scratch.replay(key, value)
    if key == b"E":
        return f"coordinator epoch {scratch.coordinator_epoch} (node {scratch.epoch_owner_node_id})"
    for md in scratch.transactions.values():
        return (f"{md.transactional_id} {md.state.value} pid={md.producer_id} "
                f"epoch={md.producer_epoch} prev={md.previous_producer_epoch} "
                f"parts={sorted(p for _t, p in md.partitions)} why={md.bump_reason or '-'}")
    return f"tombstone {key!r}"


# --------------------------------------------------------------------- nodes


@dataclass(slots=True)
class Call:
    deadline_ms: int
    context: object


class Node:
    """A process: it receives messages and keeps its outstanding calls, each
    with a deadline after which it counts as REQUEST_TIMED_OUT."""

    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.name = name
        self.alive = True
        self.calls: dict[int, Call] = {}
        # A paused process (GC, a stalled disk, SIGSTOP) neither receives nor
        # acts nor notices timeouts until then.
        self.stalled_until_ms = -1

    def deliverable(self) -> bool:
        return self.alive and self.sim.now_ms >= self.stalled_until_ms

    def call(self, dst: str, make: Callable[[int], Request], context: object) -> int:
        call_id = self.sim.new_id()
        self.calls[call_id] = Call(self.sim.now_ms + RPC_TIMEOUT_MS, context)
        self.sim.send(self.name, dst, make(call_id))
        return call_id

    def reply(self, dst: str, payload: Reply) -> None:
        self.sim.send(self.name, dst, payload)

    def expire_calls(self) -> None:
        for call_id, call in list(self.calls.items()):
            if self.sim.now_ms >= call.deadline_ms and call_id in self.calls:
                del self.calls[call_id]
                self.sim.log(f"{self.name}: call {call_id} timed out")
                self.on_reply(call_id, call.context, ErrorCode.REQUEST_TIMED_OUT, None)

    def receive(self, src: str, payload: Payload) -> None:
        if isinstance(payload, Reply):
            call = self.calls.pop(payload.call_id, None)
            if call is None:
                self.sim.log(f"{self.name}: late reply to call {payload.call_id} ignored")
                return
            self.on_reply(payload.call_id, call.context, payload.code, payload)
            return
        self.on_request(src, payload)

    def on_request(self, src: str, request: Request) -> None:
        raise InvariantViolation(f"{self.name} got an unexpected {show(request)}")

    def on_reply(self, call_id: int, context: object, code: ErrorCode,
                 reply: Reply | None) -> None:
        raise InvariantViolation(f"{self.name} got an unexpected reply")


# ---------------------------------------------------------------- the store


@dataclass(slots=True)
class PendingWrite:
    """A write group waiting for its group commit, and the replies that go
    out once it is durable (runtime.py answers only then)."""

    group: WriteGroup
    offsets: tuple[int, int] | None
    replies: list[tuple[str, Reply]]
    what: str


@dataclass(slots=True)
class Gate:
    """A producer's first transactional batch on the partition waits for the
    coordinator's verification; its later batches wait behind it (runtime.py
    and partition.py's verification gates)."""

    producer_id: int
    src: str
    request: ProduceRequest
    waiting: list[tuple[str, ProduceRequest]] = field(default_factory=list)


class StoreNode(Node):
    """One partition on one store node: a real PartitionRuntime on a
    MemoryStore; request handling mirrors runtime.py's produce and
    write_txn_markers."""

    def __init__(self, sim: Simulation, partition: int, topic: TopicRecord) -> None:
        super().__init__(sim, f"store-{partition}")
        self.partition = partition
        self.topic = topic
        self.durable = MemoryStore()
        self.part = self._recover()
        self.pending: list[PendingWrite] = []
        self.gates: dict[int, Gate] = {}

    def _recover(self) -> PartitionRuntime:
        return PartitionRuntime.recover(
            self.topic, self.partition, self.durable, now_ms=self.sim.now_ms,
            producer_id_expiration_ms=PRODUCER_ID_EXPIRATION_MS,
        )

    def on_request(self, src: str, request: Request) -> None:
        if isinstance(request, ProduceRequest):
            self._produce(src, request)
        elif isinstance(request, MarkerRequest):
            self._marker(src, request)
        else:
            super().on_request(src, request)

    def _produce(self, src: str, request: ProduceRequest) -> None:
        pid = read_header(request.batch).producer_id
        gate = self.gates.get(pid)
        if gate is not None:
            gate.waiting.append((src, request))
            self.sim.log(f"{self.name}: {request.summary} waits behind pid {pid}'s verification")
            return
        self._append(src, request, verified=False)

    def _append(self, src: str, request: ProduceRequest, *, verified: bool) -> None:
        """runtime.produce / _append_deferred for one item."""
        try:
            result = self.part.append(
                request.batch, expected_log_end_offset=None, now_ms=self.sim.now_ms,
                transactional_id=request.transactional_id, txn_verified=verified,
            )
        except ServiceError as exc:
            self.sim.log(f"{self.name}: {request.summary} refused: {exc.code.name}")
            self.reply(src, ProduceReply(request.call_id, exc.code, -1, False))
            return
        if isinstance(result, VerifyFirst):
            invariant(not verified, "a verified append asked for verification")
            gate = Gate(result.producer_id, src, request)
            self.gates[result.producer_id] = gate
            dst = self.sim.route_to_coordinator()
            self.call(dst, lambda call_id: VerifyRequest(
                call_id, request.transactional_id, result.producer_id, result.producer_epoch,
                self.partition, request.add_partitions), gate)
            self.sim.log(f"{self.name}: {request.summary} needs verification, asking {dst}")
            return
        if isinstance(result, WaitForGate):
            raise InvariantViolation("harness: the simulated store keeps its own gates")
        if isinstance(result, Duplicate):
            reply = ProduceReply(request.call_id, ErrorCode.NONE, result.base_offset, True)
            pending = self._pending_at(result.base_offset)
            self.sim.log(f"{self.name}: {request.summary} is a duplicate of offset "
                         f"{result.base_offset}{' (not durable yet)' if pending else ''}")
            if pending is not None:
                pending.replies.append((src, reply))
            else:
                self.reply(src, reply)
            return
        header = read_header(request.batch)
        self.sim.ledger.on_data_appended(self.partition, result.base_offset, header,
                                         request.transactional_id)
        self.sim.log(f"{self.name}: {request.summary} appended at {result.base_offset} "
                     f"(LSO {self.part.log.last_stable_offset}, HW {self.part.log.high_watermark})")
        self.pending.append(PendingWrite(
            result.group, (result.base_offset, result.next_offset),
            [(src, ProduceReply(request.call_id, ErrorCode.NONE, result.base_offset, False))],
            f"{request.summary}@{result.base_offset}",
        ))

    def on_reply(self, call_id: int, context: object, code: ErrorCode,
                 reply: Reply | None) -> None:
        invariant(isinstance(context, Gate), "harness: a store call is a verification")
        assert isinstance(context, Gate)  # for mypy; invariant() guards at runtime
        gate = context
        if self.gates.get(gate.producer_id) is gate:
            del self.gates[gate.producer_id]
        if code is ErrorCode.NONE:
            self.sim.log(f"{self.name}: {gate.request.summary} verified")
            self._append(gate.src, gate.request, verified=True)
        else:
            self.sim.log(f"{self.name}: {gate.request.summary} not verified: {code.name}")
            self.reply(gate.src, ProduceReply(gate.request.call_id, code, -1, False))
        for src, request in gate.waiting:
            self._produce(src, request)

    def _marker(self, src: str, request: MarkerRequest) -> None:
        """runtime.write_txn_markers for one partition."""
        marker = TxnMarker(request.producer_id, request.producer_epoch,
                           MARKER_COMMIT if request.commit else MARKER_ABORT,
                           request.coordinator_epoch)
        what = (f"{'COMMIT' if request.commit else 'ABORT'} marker pid={request.producer_id} "
                f"epoch={request.producer_epoch} coord_epoch={request.coordinator_epoch}")
        try:
            result = self.part.append_marker(marker, now_ms=self.sim.now_ms)
        except ServiceError as exc:
            self.sim.log(f"{self.name}: {what} refused: {exc.code.name}")
            self.reply(src, MarkerReply(request.call_id, exc.code))
            return
        reply = MarkerReply(request.call_id, ErrorCode.NONE)
        if isinstance(result, DuplicateMarker):
            pending = self._pending_at(result.offset)
            self.sim.log(f"{self.name}: {what} repeats offset {result.offset}"
                         f"{' (not durable yet)' if pending else ''}")
            if pending is not None:
                pending.replies.append((src, reply))
            else:
                self.reply(src, reply)
            return
        self.sim.log(f"{self.name}: {what} appended at {result.base_offset}")
        self.pending.append(PendingWrite(
            result.group, (result.base_offset, result.next_offset), [(src, reply)],
            f"{what}@{result.base_offset}",
        ))

    def _pending_at(self, base_offset: int) -> PendingWrite | None:
        for pending in self.pending:
            if pending.offsets is not None and pending.offsets[0] == base_offset:
                return pending
        return None

    def flush(self, count: int) -> None:
        """A group commit of the oldest `count` write groups: written, the HW
        moved (on_durable, in offset order), then the replies go out."""
        written, self.pending = self.pending[:count], self.pending[count:]
        for pending in written:
            self.durable.write(pending.group)
            if pending.offsets is not None:
                self.part.on_durable(*pending.offsets)
        self.sim.log(f"{self.name}: group commit of {[p.what for p in written]} "
                     f"-> HW {self.part.log.high_watermark}, LSO "
                     f"{self.part.log.last_stable_offset}")
        for pending in written:
            for dst, reply in pending.replies:
                self.reply(dst, reply)

    def expire_producers(self) -> None:
        """runtime.run_retention_once's producer expiry (retention itself is
        not simulated: with nothing ever deleted the checker can read from 0).
        Producers whose verification is out are kept, as the runtime's gates
        keep them."""
        expired = self.part.expire_producers(now_ms=self.sim.now_ms,
                                             expiration_ms=PRODUCER_ID_EXPIRATION_MS,
                                             verifying=set(self.gates))
        if expired:
            self.sim.log(f"{self.name}: producers {expired} expired")

    def snapshot(self) -> None:
        group = self.part.build_snapshot(now_ms=self.sim.now_ms, force=True)
        if group is not None:
            self.pending.append(PendingWrite(group, None, [],
                                             f"snapshot@{self.part.log.log_end_offset}"))
            self.sim.log(f"{self.name}: snapshot at {self.part.log.log_end_offset} queued")

    def crash(self) -> None:
        """kill -9 and restart: memory and unflushed groups are gone."""
        durable_end = self.part.log.high_watermark
        lost = [p.what for p in self.pending]
        self.pending = []
        self.gates = {}
        self.calls = {}
        self.sim.ledger.on_store_crash(self.partition, durable_end)
        self.part = self._recover()
        self.sim.log(f"{self.name}: CRASH + recovery, lost {lost}; recovered HW "
                     f"{self.part.log.high_watermark}, LSO {self.part.log.last_stable_offset}")


# ---------------------------------------------------------- the coordinator


@dataclass(slots=True)
class MarkerTask:
    """txn_runtime._complete_with_markers for one transactional id."""

    token: int
    transactional_id: str
    md: txn.TxnMetadata
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    remaining: set[tuple[str, int]]
    in_flight: dict[int, tuple[str, int]] = field(default_factory=dict)
    retry_at_ms: int = 0
    backoff_ms: int = MARKER_BACKOFF_MS_MIN


@dataclass(frozen=True, slots=True)
class MarkerCtx:
    transactional_id: str
    token: int
    tp: tuple[str, int]


class CoordinatorNode(Node):
    """One coordinator process owning the one `__transaction_state`
    partition: txn_runtime.TxnCoordinatorRuntime's OwnedPartition and
    request handlers, over the pure core."""

    def __init__(self, sim: Simulation, node_id: int, incarnation: int) -> None:
        super().__init__(sim, f"coord-{node_id}.{incarnation}")
        self.node_id = node_id
        self.state = TxnPartitionState()
        self.log_end_offset = 0
        self.loaded = False
        self.fenced = False
        self.my_epoch = -1
        self.load_retry_at_ms = 0
        self.load_backoff_ms = 50
        self.last_tick_ms = sim.now_ms
        self.tasks: dict[str, MarkerTask] = {}
        # Requests held while their transactional id's markers are in flight
        # (txn_runtime._wait_for_markers): (src, request, held until).
        self.held: list[tuple[str, HeldRequest, int]] = []

    # -- loading (txn_runtime._load, _resume_markers, _unload)

    def load(self) -> None:
        entries, log_end = self.sim.txn_log.read_all()
        state = TxnPartitionState()
        for key, value in entries:
            state.replay(key, value)
        if self.my_epoch >= 0:
            if state.coordinator_epoch != self.my_epoch:
                self.fenced = True
                self.sim.log(f"{self.name}: reload finds coordinator epoch "
                             f"{state.coordinator_epoch} above mine {self.my_epoch}: fenced")
                return
            self.state, self.log_end_offset, self.loaded = state, log_end, True
            self.sim.log(f"{self.name}: reloaded at {log_end}")
            self._resume_markers()
            return
        record = encode_epoch(state.coordinator_epoch + 1, self.node_id)
        try:
            self.log_end_offset = self.sim.txn_log.append(
                [record], expected_log_end_offset=log_end, writer=self.name)
        except ServiceError as exc:
            self.load_retry_at_ms = self.sim.now_ms + self.load_backoff_ms
            self.load_backoff_ms = min(self.load_backoff_ms * 2, 1000)
            self.sim.log(f"{self.name}: load failed ({exc.code.name}); retrying")
            return
        state.replay(*record)
        self.state, self.my_epoch, self.loaded = state, state.coordinator_epoch, True
        self.sim.log(f"{self.name}: loaded, coordinator epoch {self.my_epoch}, "
                     f"{len(state.transactions)} transactional ids")
        self._resume_markers()

    def _resume_markers(self) -> None:
        for md in list(self.state.transactions.values()):
            if md.state.is_prepare:
                self._start_markers(md.transactional_id)

    def _unload(self) -> None:
        self.loaded = False
        self.tasks.clear()
        self.load_retry_at_ms = self.sim.now_ms

    def _owned(self) -> None:
        """txn_runtime.owned_for / _check_loaded."""
        if self.fenced:
            raise ServiceError(ErrorCode.NOT_COORDINATOR, f"{self.name} is fenced")
        if not self.loaded:
            raise ServiceError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{self.name} loading")

    def _persist(self, records: list[Entry]) -> None:
        """txn_runtime._persist: append, then replay; reload on failure."""
        try:
            self.log_end_offset = self.sim.txn_log.append(
                records, expected_log_end_offset=self.log_end_offset, writer=self.name)
        except ServiceError as exc:
            self._unload()
            code = (ErrorCode.NOT_COORDINATOR if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH
                    else ErrorCode.COORDINATOR_NOT_AVAILABLE)
            raise ServiceError(code, f"transaction log write failed: {exc.message}") from exc
        for key, value in records:
            self.state.replay(key, value)

    def _fresh_id_if_needed(self, md: txn.TxnMetadata | None) -> int | None:
        return self.sim.allocate_producer_id() if txn.needs_fresh_producer_id(md) else None

    # -- requests

    def on_request(self, src: str, request: Request) -> None:
        if isinstance(request, HeldRequest) and not self.fenced and self.loaded \
                and request.transactional_id in self.tasks:
            # txn_runtime._wait_for_markers: owned_for() passed, markers are
            # in flight; the request waits for them (bounded), then runs.
            self.held.append((src, request, self.sim.now_ms + WAIT_FOR_MARKERS_MS))
            self.sim.log(f"{self.name}: holds {show(request)} until "
                         f"{request.transactional_id}'s markers land")
            return
        self._handle(src, request)

    def _handle(self, src: str, request: Request) -> None:
        if isinstance(request, InitRequest):
            self._init(src, request)
        elif isinstance(request, AddPartitionsRequest):
            self._add_partitions(src, request)
        elif isinstance(request, EndTxnRequest):
            self._end_txn(src, request)
        elif isinstance(request, VerifyRequest):
            self._verify(src, request)
        elif isinstance(request, PrepareRequest):
            self._prepare(src, request)
        elif isinstance(request, CompleteRequest):
            self._complete_prepared(src, request)
        else:
            super().on_request(src, request)

    def _serve(self, src: str, request: Request, handle: Callable[[], Reply],
               refused: Callable[[ErrorCode], Reply]) -> None:
        """The shape of txn_runtime's request handlers: owned_for and
        _check_loaded, plan, persist, answer. A refusal planned from memory
        is confirmed against the log end first (txn_runtime._confirm_refusal):
        a zombie answers NOT_COORDINATOR instead."""
        try:
            self._owned()
            reply = handle()
        except ServiceError as exc:
            code = exc.code
            if not code.retriable:
                try:
                    self._confirm_ownership()
                except ServiceError as moved:
                    code = moved.code
            reply = refused(code)
        self.sim.log(f"{self.name}: {show(request)} -> {show(reply)}")
        self.reply(src, reply)

    def _init(self, src: str, request: InitRequest) -> None:
        """txn_runtime.init_producer_id."""
        tid = request.transactional_id

        def handle() -> Reply:
            md = self.state.transactions.get(tid)
            plan = txn.plan_init_producer_id(
                md, transactional_id=tid, transaction_timeout_ms=request.transaction_timeout_ms,
                max_transaction_timeout_ms=MAX_TXN_TIMEOUT_MS, now_ms=self.sim.now_ms,
                fresh_producer_id=self._fresh_id_if_needed(md),
                two_phase_commit=request.two_phase_commit,
                keep_prepared_txn=request.keep_prepared_txn,
            )
            self._persist([encode_txn(plan.to_persist)])
            if plan.abort_started:
                self._start_markers(tid)
                raise ServiceError(ErrorCode.CONCURRENT_TRANSACTIONS, "aborting the previous one")
            return InitReply(request.call_id, ErrorCode.NONE, plan.to_persist.producer_id,
                             plan.to_persist.producer_epoch, plan.kept_prepared)

        self._serve(src, request, handle,
                    lambda code: InitReply(request.call_id, code, -1, -1))

    def _add_partitions(self, src: str, request: AddPartitionsRequest) -> None:
        """txn_runtime.add_partitions, asked by a client."""
        def handle() -> Reply:
            self._add(request.transactional_id, request.producer_id, request.producer_epoch,
                      frozenset((TOPIC, p) for p in request.partitions))
            return AddPartitionsReply(request.call_id, ErrorCode.NONE)

        self._serve(src, request, handle,
                    lambda code: AddPartitionsReply(request.call_id, code))

    def _add(self, tid: str, producer_id: int, producer_epoch: int,
             partitions: frozenset[tuple[str, int]]) -> None:
        """txn_runtime._change for an add: a write, or (nothing new) a
        log-end check, since nothing written proved memory current."""
        planned = txn.plan_add_partitions(
            self.state.transactions.get(tid), transactional_id=tid,
            producer_id=producer_id, producer_epoch=producer_epoch,
            partitions=partitions, max_partitions=1000, now_ms=self.sim.now_ms,
        )
        if planned is not None:
            self._persist([encode_txn(planned)])
        else:
            self._confirm_ownership()

    def _verify(self, src: str, request: VerifyRequest) -> None:
        """txn_runtime.verify_partitions: answered from memory once the log
        end confirms that memory is the log's state. With `add`,
        txn_runtime.add_partitions (a write, or a log-end check when the
        partition is already in the transaction)."""
        tp = (TOPIC, request.partition)
        if request.add:
            def handle() -> Reply:
                self._add(request.transactional_id, request.producer_id,
                          request.producer_epoch, frozenset({tp}))
                return VerifyReply(request.call_id, ErrorCode.NONE)

            self._serve(src, request, handle, lambda code: VerifyReply(request.call_id, code))
            return
        try:
            self._owned()
            self._confirm_ownership()
            md = self.state.transactions.get(request.transactional_id)
            if md is None or md.state is txn.TxnState.DEAD or \
                    md.producer_id != request.producer_id:
                code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
            elif md.producer_epoch != request.producer_epoch:
                code = ErrorCode.PRODUCER_FENCED
            elif md.state is not txn.TxnState.ONGOING or tp not in md.partitions:
                code = ErrorCode.INVALID_TXN_STATE
            else:
                code = ErrorCode.NONE
        except ServiceError as exc:
            code = exc.code
        reply = VerifyReply(request.call_id, code)
        self.sim.log(f"{self.name}: {show(request)} -> {show(reply)}")
        self.reply(src, reply)

    def _prepare(self, src: str, request: PrepareRequest) -> None:
        """txn_runtime.prepare."""
        def handle() -> Reply:
            planned = txn.plan_prepare(
                self.state.transactions.get(request.transactional_id),
                transactional_id=request.transactional_id, producer_id=request.producer_id,
                producer_epoch=request.producer_epoch, now_ms=self.sim.now_ms,
            )
            if planned is not None:
                self._persist([encode_txn(planned)])
            return PrepareReply(request.call_id, ErrorCode.NONE)

        self._serve(src, request, handle, lambda code: PrepareReply(request.call_id, code))

    def _complete_prepared(self, src: str, request: CompleteRequest) -> None:
        """txn_runtime.complete_prepared."""
        tid = request.transactional_id

        def handle() -> Reply:
            plan = self._decide(tid, lambda md, fresh_producer_id: txn.plan_complete_prepared(
                md, transactional_id=tid, producer_id=request.producer_id,
                producer_epoch=request.producer_epoch, prepared=request.prepared,
                now_ms=self.sim.now_ms, fresh_producer_id=fresh_producer_id,
            ))
            return CompleteReply(request.call_id, ErrorCode.NONE, plan.committed,
                                 plan.producer_id, plan.producer_epoch)

        self._serve(src, request, handle,
                    lambda code: CompleteReply(request.call_id, code, False, -1, -1))

    def _confirm_ownership(self) -> None:
        """txn_runtime._confirm_ownership / _check_log_end. The simulated log
        is read at once and this node never has a write in flight while it
        handles a request, so the first read is already the one the runtime
        makes under the lock."""
        log_end = self.sim.txn_log.log_end_offset()
        if log_end == self.log_end_offset:
            return
        self.sim.log(f"{self.name}: the log ends at {log_end}, my memory at "
                     f"{self.log_end_offset}: another coordinator wrote it; reloading")
        self._unload()
        raise ServiceError(ErrorCode.NOT_COORDINATOR, f"{self.name}: the log moved")

    def _decide(self, tid: str, plan: Callable[[txn.TxnMetadata | None, int | None],
                                               DecisionPlan]) -> DecisionPlan:
        """txn_runtime._decide: plan, persist the decision, send its markers."""
        md = self.state.transactions.get(tid)
        planned = plan(md, self._fresh_id_if_needed(md) if md else None)
        if planned.to_persist is not None:
            self._persist([encode_txn(planned.to_persist)])
            self._start_markers(tid)
        return planned

    def _end_txn(self, src: str, request: EndTxnRequest) -> None:
        """txn_runtime.end_txn."""
        tid = request.transactional_id

        def handle() -> Reply:
            plan = self._decide(tid, lambda md, fresh_producer_id: txn.plan_end_txn(
                md, transactional_id=tid, producer_id=request.producer_id,
                producer_epoch=request.producer_epoch, commit=request.commit,
                now_ms=self.sim.now_ms, fresh_producer_id=fresh_producer_id,
            ))
            return EndTxnReply(request.call_id, ErrorCode.NONE, plan.producer_id,
                               plan.producer_epoch)

        self._serve(src, request, handle,
                    lambda code: EndTxnReply(request.call_id, code, -1, -1))

    def admin_abort_random(self) -> None:
        """txn_runtime.force_abort (the hanging-transaction tool) on a random
        open transaction: abort it now, fencing its producer."""
        ongoing = sorted(tid for tid, md in self.state.transactions.items()
                         if md.state in (txn.TxnState.ONGOING, txn.TxnState.PREPARED))
        if not self.loaded or self.fenced or not ongoing:
            return
        tid = self.sim.rng.choice(ongoing)
        md = self.state.transactions[tid]
        planned = txn.plan_admin_abort(md, transactional_id=tid, now_ms=self.sim.now_ms,
                                       fresh_producer_id=self._fresh_id_if_needed(md))
        self.sim.log(f"{self.name}: ADMIN aborts the open transaction of {tid}")
        try:
            self._persist([encode_txn(planned)])
        except ServiceError as exc:
            self.sim.log(f"{self.name}: admin abort failed: {exc.code.name}")
            return
        self._start_markers(tid)

    # -- markers (txn_runtime._start_markers, _complete_with_markers)

    def _start_markers(self, tid: str) -> None:
        if tid in self.tasks:
            return
        md = self.state.transactions.get(tid)
        if md is None or not md.state.is_prepare:
            return
        producer_id, producer_epoch = txn.marker_target(md)
        self.tasks[tid] = MarkerTask(
            token=self.sim.new_id(), transactional_id=tid, md=md, producer_id=producer_id,
            producer_epoch=producer_epoch, commit=md.state is txn.TxnState.PREPARE_COMMIT,
            coordinator_epoch=self.state.coordinator_epoch, remaining=set(md.partitions),
            retry_at_ms=self.sim.now_ms,
        )

    def _releasable(self) -> int | None:
        """The first held request whose markers are done (or given up on:
        unloaded, fenced) or whose wait is over."""
        for i, (_src, request, until_ms) in enumerate(self.held):
            if request.transactional_id not in self.tasks or self.sim.now_ms >= until_ms:
                return i
        return None

    def has_work(self) -> bool:
        if not self.deliverable():
            return False
        if self._releasable() is not None:
            return True
        if not self.loaded:
            return not self.fenced and self.sim.now_ms >= self.load_retry_at_ms
        # Fenced by a marker reply, a coordinator keeps its other marker tasks
        # running, as txn_runtime does; their completion write then fails.
        return any(not t.in_flight and (not t.remaining or self.sim.now_ms >= t.retry_at_ms)
                   for t in self.tasks.values())

    def work(self) -> None:
        """One background step: a held request going on, a (re)load, a round
        of markers, or a completion."""
        released = self._releasable()
        if released is not None:
            src, request, _until_ms = self.held.pop(released)
            self._handle(src, request)
            return
        if not self.loaded:
            self.load()
            return
        for tid in sorted(self.tasks):
            task = self.tasks[tid]
            if task.in_flight:
                continue
            if not task.remaining:
                self._complete(task)
                return
            if self.sim.now_ms >= task.retry_at_ms:
                for tp in sorted(task.remaining):
                    self._send_marker(task, tp)
                self.sim.log(f"{self.name}: markers for {tid} "
                             f"({'COMMIT' if task.commit else 'ABORT'} pid={task.producer_id} "
                             f"epoch={task.producer_epoch}) to "
                             f"{sorted(p for _t, p in task.remaining)}")
                return

    def _send_marker(self, task: MarkerTask, tp: tuple[str, int]) -> None:
        call_id = self.call(
            f"store-{tp[1]}",
            lambda call_id: MarkerRequest(
                call_id, task.transactional_id, task.producer_id, task.producer_epoch,
                task.commit, task.coordinator_epoch, tp[1]),
            MarkerCtx(task.transactional_id, task.token, tp),
        )
        task.in_flight[call_id] = tp

    def on_reply(self, call_id: int, context: object, code: ErrorCode,
                 reply: Reply | None) -> None:
        invariant(isinstance(context, MarkerCtx), "harness: a coordinator call is a marker")
        assert isinstance(context, MarkerCtx)  # for mypy; invariant() guards at runtime
        task = self.tasks.get(context.transactional_id)
        if task is None or task.token != context.token:
            return
        task.in_flight.pop(call_id, None)
        tp = context.tp
        if code in MARKER_DONE:
            task.remaining.discard(tp)
        elif code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
            self.sim.log(f"{self.name}: marker refused as a zombie's: fenced")
            self.fenced = True
            del self.tasks[task.transactional_id]
            return
        elif not code.retriable:
            # txn_runtime logs it loudly and gives up on the partition.
            self.sim.log(f"{self.name}: MARKER REFUSED for {task.transactional_id} on p{tp[1]}: "
                         f"{code.name}; giving up on that partition")
            task.remaining.discard(tp)
        if not task.in_flight and task.remaining:
            task.retry_at_ms = self.sim.now_ms + task.backoff_ms
            task.backoff_ms = min(task.backoff_ms * 2, MARKER_BACKOFF_MS_MAX)

    def _complete(self, task: MarkerTask) -> None:
        del self.tasks[task.transactional_id]
        current = self.state.transactions.get(task.transactional_id)
        if (not self.loaded or current is None or current.state != task.md.state
                or current.producer_epoch != task.md.producer_epoch):
            return
        try:
            self._persist([encode_txn(txn.plan_complete(current, now_ms=self.sim.now_ms))])
        except ServiceError as exc:
            self.sim.log(f"{self.name}: completing {task.transactional_id} failed: "
                         f"{exc.code.name}; will resume after reload")

    # -- timer (txn_runtime._timer_loop, _check_timeouts)

    def timer_due(self) -> bool:
        """The timer loop's next check is due. It is an event of its own: after
        a pause, an overdue timer and a pending request run in either order
        on an event loop."""
        return (self.deliverable() and self.loaded and not self.fenced
                and self.sim.now_ms - self.last_tick_ms >= TIMER_INTERVAL_MS)

    def tick(self) -> None:
        if not self.timer_due():
            return
        self.last_tick_ms = self.sim.now_ms
        try:
            for tid, md in list(self.state.transactions.items()):
                if txn.plan_expire(md, now_ms=self.sim.now_ms,
                                   expiration_ms=TRANSACTIONAL_ID_EXPIRATION_MS):
                    self.sim.log(f"{self.name}: transactional id {tid} expired")
                    self._persist([encode_tombstone(tid)])
                    continue
                if not txn.is_timed_out(md, self.sim.now_ms):
                    continue
                current = self.state.transactions.get(tid)
                if current is None or not self.loaded:
                    continue
                planned = txn.plan_timeout_abort(
                    current, now_ms=self.sim.now_ms,
                    fresh_producer_id=self._fresh_id_if_needed(current))
                if planned is None:
                    continue
                self.sim.log(f"{self.name}: transaction of {tid} timed out: aborting")
                self._persist([encode_txn(planned)])
                self._start_markers(tid)
        except ServiceError as exc:
            self.sim.log(f"{self.name}: timeout check failed: {exc.code.name}")


# ------------------------------------------------------------- the producer


class Status(enum.Enum):
    INIT = "init"
    READY = "ready"
    IN_TXN = "in_txn"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    # Two-phase commit: flushing, then PrepareTransaction until answered;
    # holding a prepared transaction; CompleteTransaction until answered.
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMPLETING = "completing"


# Statuses in which the transaction's batches are still being sent.
SENDING = (Status.IN_TXN, Status.COMMITTING, Status.PREPARING)


@dataclass(slots=True)
class OutBatch:
    batch_no: int
    partition: int
    base_sequence: int
    record_ids: tuple[bytes, ...]
    data: bytes
    summary: str
    call_id: int | None = None
    acked: bool = False
    resend_at_ms: int = 0
    # Whether an earlier batch on the partition was unacknowledged when this
    # attempt was sent: then the store may see this one first (reordering,
    # a crash that lost the earlier one) and refuse it as out of order.
    sent_behind_unacked: bool = False


@dataclass(frozen=True, slots=True)
class ProduceCtx:
    batch_no: int


@dataclass(frozen=True, slots=True)
class InitCtx:
    pass


@dataclass(frozen=True, slots=True)
class AddCtx:
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EndCtx:
    commit: bool


@dataclass(frozen=True, slots=True)
class PrepareCtx:
    pass


@dataclass(frozen=True, slots=True)
class CompleteCtx:
    prepared: tuple[int, int]


class ProducerNode(Node):
    """One instance of a transactional producer, behaving as a correct client
    (sdk/oncelog/_transactions.py's rules): retries re-send the same request;
    it commits only when every batch of the transaction is acknowledged; a
    commit whose outcome is unknown is retried, never turned into an abort.
    A replaced instance may keep running (a zombie).

    A two-phase-commit producer (KIP-939) mostly prepares instead of
    committing and hands its prepared state to an outside coordinator (the
    simulation's `handed`); it, or a later instance that kept the prepared
    transaction (`keep_prepared`), completes it with that state — now and
    then with a wrong one, which must abort it — and a later instance may
    complete an already completed state again."""

    def __init__(self, sim: Simulation, transactional_id: str, instance: int,
                 transaction_timeout_ms: int, *, two_phase: bool = False,
                 keep_prepared: bool = False) -> None:
        super().__init__(sim, f"{transactional_id}#{instance}")
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.status = Status.INIT
        self.producer_id = -1
        self.producer_epoch = -1
        self.coordinator_call: int | None = None
        self.retry_at_ms = 0
        self.txn: ClientTxn | None = None
        self.added: set[int] = set()
        self.next_sequence: dict[int, int] = {}
        self.batches: dict[int, OutBatch] = {}
        self.next_batch_no = 0
        self.zombie = False
        # Some request of the open transaction went to the coordinator.
        self.touched = False
        self.two_phase = two_phase
        self.keep_prepared = keep_prepared
        # The SDK's way: no AddPartitionsToTxn, the store adds each partition
        # (add_partitions_to_txn); otherwise the client adds them itself.
        self.store_adds = sim.rng.random() < 0.5
        # The prepared state this instance completes (PREPARED, COMPLETING),
        # and the handed-over state that decision stands for.
        self.complete_with: tuple[int, int] | None = None
        self.completing_for: tuple[int, int] | None = None

    # -- acting

    def act(self, *, finishing: bool) -> bool:
        """Does the next thing this client would do; False when it has nothing
        to do now. `finishing`: the run is quiescing, so no new transactions
        and no new records — only finish what is open."""
        if not self.deliverable() or self.status is Status.FATAL:
            return False
        now = self.sim.now_ms
        if self.status in SENDING:
            for batch in self.batches.values():
                if not batch.acked and batch.call_id is None and now >= batch.resend_at_ms:
                    self._send_batch(batch, retry=True)
                    return True
        coordinator_free = self.coordinator_call is None and now >= self.retry_at_ms
        if self.status is Status.INIT:
            if coordinator_free:
                self._coordinator_call(
                    lambda call_id: InitRequest(call_id, self.transactional_id,
                                                self.transaction_timeout_ms, self.two_phase,
                                                self.keep_prepared), InitCtx())
                return True
            return False
        if self.status is Status.PREPARING:
            # prepare_transaction flushes first, as commit_transaction does.
            if coordinator_free and all(b.acked for b in self.batches.values()):
                assert self.txn is not None  # preparing a transaction
                # The client consents to commit; the outside coordinator decides.
                self.txn.commit_requested = True
                self._coordinator_call(
                    lambda call_id: PrepareRequest(call_id, self.transactional_id,
                                                   self.producer_id, self.producer_epoch),
                    PrepareCtx())
                return True
            return False
        if self.status is Status.PREPARED:
            # The outside coordinator completes when it will; quiescing, now.
            if coordinator_free and (finishing or self.sim.rng.random() < 0.3):
                self.status = Status.COMPLETING
                self._send_complete()
                return True
            return False
        if self.status is Status.COMPLETING:
            if coordinator_free:
                self._send_complete()
                return True
            return False
        if self.status is Status.READY:
            if finishing:
                return False
            self._begin()
            return True
        if self.status is Status.COMMITTING:
            # commit_transaction flushes first: every batch acknowledged,
            # then EndTxn(commit) (re-sent with the same epoch until answered).
            if coordinator_free and all(b.acked for b in self.batches.values()):
                assert self.txn is not None  # committing a transaction
                self.txn.commit_requested = True
                self._send_end(commit=True)
                return True
            return False
        if self.status is Status.ABORTING:
            if coordinator_free:
                self._send_end(commit=False)
                return True
            return False
        if self.status is Status.ABORTABLE:
            if coordinator_free:
                self._abort()
                return True
            return False
        invariant(self.status is Status.IN_TXN, "harness: unknown producer status")
        if finishing:
            return self._commit()
        # Mostly write, then commit; aborts are rarer than the faults that
        # abort transactions anyway (timeouts, fencing).
        choice = self.sim.rng.random()
        if choice < 0.8:
            return self._write(coordinator_free)
        if choice < 0.97:
            return self._commit()
        return self._abort() if coordinator_free else False

    def _begin(self) -> None:
        self.txn = self.sim.ledger.begin(self.transactional_id, self.name, self.producer_id,
                                         self.producer_epoch)
        self.status = Status.IN_TXN
        self.added = set()
        self.touched = False
        self.batches = {}
        self.sim.log(f"{self.name}: begin transaction (pid {self.producer_id}, "
                     f"epoch {self.producer_epoch})")

    def _write(self, coordinator_free: bool) -> bool:
        rng = self.sim.rng
        partition = rng.randrange(len(self.sim.stores))
        misbehave = (partition not in self.added and not self.store_adds
                     and rng.random() < 0.03)
        if misbehave:
            # A client bug: a write to a partition never added to the
            # transaction. The store's verification must refuse it, or the
            # transaction would hang on a partition the coordinator does not
            # know about.
            self.sim.log(f"{self.name}: CLIENT BUG: writes p{partition} without AddPartitions")
        elif partition not in self.added and not self.store_adds:
            if not coordinator_free:
                return False
            parts = {partition}
            if rng.random() < 0.3:
                parts.add(rng.randrange(len(self.sim.stores)))
            partitions = tuple(sorted(parts))
            self.touched = True
            self._coordinator_call(
                lambda call_id: AddPartitionsRequest(
                    call_id, self.transactional_id, self.producer_id, self.producer_epoch,
                    partitions), AddCtx(partitions))
            return True
        # The window runs from the oldest unacknowledged batch on the
        # partition: a retry must stay within the store's dedup window, so
        # acknowledged batches after an unacknowledged one count too.
        on_partition = [b for b in self.batches.values() if b.partition == partition]
        first_unacked = next((i for i, b in enumerate(on_partition) if not b.acked), None)
        if first_unacked is not None and \
                len(on_partition) - first_unacked >= MAX_IN_FLIGHT_PER_PARTITION:
            return False
        assert self.txn is not None  # in a transaction
        count = rng.randint(1, 3)
        ids = tuple(self.sim.ledger.new_record(self.txn, partition) for _ in range(count))
        sequence = self.next_sequence.get(partition, 0)
        self.next_sequence[partition] = sequence + count
        data = encode_batch(
            [(None, record_id, None, self.sim.now_ms) for record_id in ids],
            producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            base_sequence=sequence, transactional=True,
        )
        summary = (f"[{self.name} p{partition} pid={self.producer_id} e={self.producer_epoch} "
                   f"seq={sequence}..{sequence + count - 1} "
                   f"{b','.join(ids).decode()}]")
        batch = OutBatch(self.next_batch_no, partition, sequence, ids, data, summary)
        self.next_batch_no += 1
        self.batches[batch.batch_no] = batch
        self._send_batch(batch, retry=False)
        return True

    def _send_batch(self, batch: OutBatch, *, retry: bool) -> None:
        if self.store_adds:
            # The store may add the partition for this request: ending the
            # transaction now needs an EndTxn (the SDK's txn_touched).
            self.touched = True
        batch.sent_behind_unacked = any(
            b.partition == batch.partition and not b.acked
            and b.base_sequence < batch.base_sequence for b in self.batches.values()
        )
        batch.call_id = self.call(
            f"store-{batch.partition}",
            lambda call_id: ProduceRequest(call_id, self.transactional_id, batch.partition,
                                           batch.summary, batch.data, self.store_adds),
            ProduceCtx(batch.batch_no),
        )
        self.sim.log(f"{self.name}: {'re-send' if retry else 'send'} {batch.summary}")

    def _commit(self) -> bool:
        """commit_transaction: no new records from here; act() sends
        EndTxn(commit) once every batch is acknowledged."""
        assert self.txn is not None  # in a transaction
        if not self.touched and not self.txn.records:
            # No request of the transaction went out: there is nothing to end
            # (as the SDK's txn_touched; an AddPartitions whose answer was lost
            # may have opened the transaction, and a two-phase-commit one
            # would never time out).
            self.sim.log(f"{self.name}: empty transaction ends locally")
            self.status = Status.READY
            return True
        prepare = self.two_phase and self.sim.rng.random() < 0.8
        self.status = Status.PREPARING if prepare else Status.COMMITTING
        unacked = sum(not b.acked for b in self.batches.values())
        self.sim.log(f"{self.name}: {'prepare' if prepare else 'commit'}: flushing {unacked} "
                     "unacknowledged batches first")
        return True

    def _abort(self) -> bool:
        # In-flight batches are abandoned: their transaction is aborted, and
        # the epoch bump fences any copy that arrives after the marker.
        self._abandon_batches()
        self.status = Status.ABORTING
        self._send_end(commit=False)
        return True

    def _send_end(self, *, commit: bool) -> None:
        self._coordinator_call(
            lambda call_id: EndTxnRequest(call_id, self.transactional_id, self.producer_id,
                                          self.producer_epoch, commit), EndCtx(commit))

    def _send_complete(self) -> None:
        prepared = self.complete_with
        assert prepared is not None  # set when the status became PREPARED/COMPLETING
        self._coordinator_call(
            lambda call_id: CompleteRequest(call_id, self.transactional_id, self.producer_id,
                                            self.producer_epoch, prepared),
            CompleteCtx(prepared))

    def _coordinator_call(self, make: Callable[[int], Request], context: object) -> None:
        dst = self.sim.route_to_coordinator()
        self.coordinator_call = self.call(dst, make, context)
        self.sim.log(f"{self.name}: -> {dst} {type(context).__name__} {context}")

    def _abandon_batches(self) -> None:
        for batch in self.batches.values():
            if batch.call_id is not None:
                self.calls.pop(batch.call_id, None)
        self.batches = {}

    def _fatal(self, why: str) -> None:
        self.status = Status.FATAL
        self._abandon_batches()
        self.sim.log(f"{self.name}: FATAL: {why}")

    def _completed(self) -> None:
        if self.completing_for is not None:
            self.sim.completed[self.transactional_id] = self.completing_for

    def _take_over(self, kept: tuple[int, int] | None) -> None:
        """The outside coordinator, in a new instance: it completes the
        prepared state it was handed (now and then a wrong one, which must
        abort the kept transaction); when nothing was kept, it may complete
        the handed state again (a repeated completion)."""
        handed = self.sim.handed.get(self.transactional_id)
        rng = self.sim.rng
        if handed is None or (kept is None and rng.random() < 0.5):
            return
        self.completing_for = handed
        if rng.random() < 0.15:
            handed = (handed[0], handed[1] + 7)
        self.complete_with = handed
        self.status = Status.PREPARED if kept is not None else Status.COMPLETING

    def _ready(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, epoch
        self.status = Status.READY
        self.next_sequence = {}
        self.added = set()
        self.batches = {}
        self.txn = None

    # -- replies

    def on_reply(self, call_id: int, context: object, code: ErrorCode,
                 reply: Reply | None) -> None:
        now = self.sim.now_ms
        if isinstance(context, ProduceCtx):
            self._on_produce(call_id, context, code)
            return
        invariant(call_id == self.coordinator_call, "harness: one coordinator call at a time")
        self.coordinator_call = None
        self.retry_at_ms = now
        if code.retriable:
            self.retry_at_ms = now + CLIENT_BACKOFF_MS
            return
        if isinstance(context, InitCtx):
            if code is ErrorCode.NONE:
                assert isinstance(reply, InitReply)
                self._ready(reply.producer_id, reply.producer_epoch)
                self.sim.log(f"{self.name}: initialized pid {reply.producer_id} epoch "
                             f"{reply.producer_epoch}"
                             + (f", keeps prepared {reply.kept}" if reply.kept else ""))
                if self.keep_prepared:
                    self._take_over(reply.kept)
            else:
                self._fatal(f"InitProducerId: {code.name}")
        elif isinstance(context, PrepareCtx):
            if code is ErrorCode.NONE:
                self.status = Status.PREPARED
                self.complete_with = (self.producer_id, self.producer_epoch)
                self.completing_for = self.complete_with
                self.sim.handed[self.transactional_id] = self.complete_with
                self.sim.log(f"{self.name}: prepared {self.complete_with}")
                if self.sim.rng.random() < 0.5:
                    # A task's way: hand the state over and exit; a new
                    # instance (the outside coordinator) completes it.
                    self.alive = False
                    self.sim.log(f"{self.name}: hands {self.complete_with} over and exits")
            elif code in FATAL_CODES:
                self._fatal(f"PrepareTransaction: {code.name}")
            else:
                self.status = Status.ABORTABLE
                self.sim.log(f"{self.name}: abortable: PrepareTransaction {code.name}")
        elif isinstance(context, CompleteCtx):
            if code is ErrorCode.NONE:
                assert isinstance(reply, CompleteReply)
                self.sim.ledger.on_complete_answered(self.transactional_id, context.prepared,
                                                     reply.committed)
                self.sim.log(f"{self.name}: completed {context.prepared}: "
                             f"{'committed' if reply.committed else 'not committed'}")
                self._ready(reply.producer_id, reply.producer_epoch)
                self._completed()
            elif code is ErrorCode.INVALID_TXN_STATE:
                # The coordinator has no record of that prepared state; nothing changed.
                self.status = Status.READY
                self.sim.log(f"{self.name}: {context.prepared} is not known")
                self._completed()
            else:
                self._fatal(f"CompleteTransaction: {code.name}")
        elif isinstance(context, AddCtx):
            if self.status not in SENDING:
                return
            if code is ErrorCode.NONE:
                self.added.update(context.partitions)
            elif code in FATAL_CODES:
                self._fatal(f"AddPartitions: {code.name}")
            else:
                self.status = Status.ABORTABLE
                self.sim.log(f"{self.name}: abortable: AddPartitions {code.name}")
        elif isinstance(context, EndCtx):
            if code is ErrorCode.NONE:
                assert isinstance(reply, EndTxnReply) and self.txn is not None
                self.sim.ledger.on_end_answered(self.txn, context.commit, reply.producer_id,
                                                reply.producer_epoch)
                self.sim.log(f"{self.name}: {'committed' if context.commit else 'aborted'}; "
                             f"now epoch {reply.producer_epoch}")
                self._ready(reply.producer_id, reply.producer_epoch)
            else:
                # FATAL_CODES, or INVALID_TXN_STATE: this client cannot go on.
                self._fatal(f"EndTxn({'commit' if context.commit else 'abort'}): {code.name}")

    def _on_produce(self, call_id: int, context: ProduceCtx, code: ErrorCode) -> None:
        batch = self.batches.get(context.batch_no)
        if batch is None or batch.call_id != call_id:
            return
        batch.call_id = None
        if code is ErrorCode.NONE:
            batch.acked = True
            assert self.txn is not None
            self.txn.acked.update(batch.record_ids)
            self.sim.log(f"{self.name}: acked {batch.summary}")
            return
        if code.retriable:
            batch.resend_at_ms = self.sim.now_ms + CLIENT_BACKOFF_MS
            return
        if code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
            if batch.sent_behind_unacked:
                # An earlier batch may not have landed yet: retry after it.
                batch.resend_at_ms = self.sim.now_ms + CLIENT_BACKOFF_MS
                return
            still_current = self.sim.ledger.current.get(self.transactional_id) == (
                self.producer_id, self.producer_epoch)
            if self.status in SENDING and still_current:
                # Every earlier batch was acknowledged (durable) before this
                # attempt left, and a retry stays within the store's dedup
                # window (the client's window is MAX_IN_FLIGHT_PER_PARTITION
                # from the oldest unacknowledged batch); the transaction is
                # still open, so the store may not have expired the producer:
                # the store lost or forgot a batch. (A client whose transaction
                # the coordinator ended may legitimately see this: the store
                # can forget an idle producer once its marker has landed.)
                raise SimViolation(
                    f"{self.name}: {batch.summary} refused as OUT_OF_ORDER_SEQUENCE_NUMBER "
                    "although every earlier batch was acknowledged (lost dedup state?)"
                )
        if code in FATAL_CODES:
            self._fatal(f"produce {batch.summary}: {code.name}")
        elif self.status in SENDING:
            self.status = Status.ABORTABLE
            self.sim.log(f"{self.name}: abortable: produce {batch.summary}: {code.name}")


# ---------------------------------------------------------------- simulator


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    ok: bool
    steps: int
    error: str
    trace_tail: str
    summary: str


class Trace:
    def __init__(self, *, verbose: bool) -> None:
        self.lines: list[str] = []
        self.verbose = verbose

    def add(self, line: str) -> None:
        self.lines.append(line)
        if self.verbose:
            print(line)

    def tail(self, count: int) -> str:
        return "\n".join(self.lines[-count:])


class Simulation:
    def __init__(self, seed: int, *, steps: int = DEFAULT_STEPS, verbose: bool = False) -> None:
        self.seed = seed
        self.steps = steps
        self.rng = random.Random(seed)
        self.now_ms = START_MS
        self.step_no = 0
        self.trace = Trace(verbose=verbose)
        self.ledger = Ledger(self)
        self.checker = Checker(self)
        self.network: list[Envelope] = []
        self._next_id = 0
        self._next_producer_id = FIRST_PRODUCER_ID
        self.faults_on = True
        rng = self.rng
        partitions = rng.randint(2, 4)
        self.coordinator_nodes = rng.randint(1, 2)
        producers = rng.randint(2, 4)
        # Some seeds run nearly fault-free (long transactions commit), some
        # are storms.
        self.fault_scale = rng.choice([0.3, 1.0, 1.0, 2.5])
        topic = TopicRecord.build(name=TOPIC, topic_id=TOPIC_ID, partitions=partitions,
                                  overrides={}, internal=False)
        self.stores = [StoreNode(self, p, topic) for p in range(partitions)]
        self.txn_log = SimTxnLog(self)
        self.coordinators: list[CoordinatorNode] = []
        self.designated = self._new_coordinator(0)
        self.producers: dict[str, list[ProducerNode]] = {}
        # Two-phase-commit transactional ids, and the outside coordinator's
        # memory: the prepared state each one last handed over.
        self.two_phase_ids = {f"tx{i}" for i in range(producers) if rng.random() < 0.4}
        self.handed: dict[str, tuple[int, int]] = {}
        # The handed state whose completion was last answered, per id.
        self.completed: dict[str, tuple[int, int]] = {}
        self.log(f"seed {seed}: {partitions} partitions, {producers} producers "
                 f"(two-phase commit: {sorted(self.two_phase_ids)}), "
                 f"{self.coordinator_nodes} coordinator node(s), fault scale {self.fault_scale}")
        if rng.random() < 0.3:
            self._near_epoch_exhaustion("tx0")
        for i in range(producers):
            self._new_producer(f"tx{i}")

    # -- plumbing

    def log(self, line: str) -> None:
        self.trace.add(f"#{self.step_no:<5} t={self.now_ms - START_MS:<6} {line}")

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def allocate_producer_id(self) -> int:
        """Producer ids come from durably claimed blocks: unique across
        coordinators and restarts (runtime.ProducerIdManager)."""
        self._next_producer_id += 1
        return self._next_producer_id

    def send(self, src: str, dst: str, payload: Payload) -> None:
        self.network.append(Envelope(self.new_id(), src, dst, payload))

    def node(self, name: str) -> Node | None:
        if name.startswith("store-"):
            return self.stores[int(name[len("store-"):])]
        for coordinator in self.coordinators:
            if coordinator.name == name:
                return coordinator
        tid = name.split("#")[0]
        for producer in self.producers.get(tid, []):
            if producer.name == name:
                return producer
        return None

    def owner(self) -> CoordinatorNode:
        """The coordinator that clients reach: the live one that claimed the
        newest coordinator epoch, else the newest process (still loading)."""
        for coordinator in self.coordinators:
            if coordinator.name == self.txn_log.epoch_writer and coordinator.alive \
                    and not coordinator.fenced:
                return coordinator
        return self.designated

    def route_to_coordinator(self) -> str:
        """Where a client or store sends a coordinator request: the owner, or
        now and then another recent process (stale metadata)."""
        if len(self.coordinators) > 1 and self.rng.random() < 0.1:
            return self.rng.choice(self.coordinators[-3:]).name
        return self.owner().name

    def _near_epoch_exhaustion(self, tid: str) -> None:
        """An id whose epoch is three bumps from int16's end (a long life of
        transactions): its next bumps rotate to a fresh producer id."""
        md = txn.TxnMetadata(
            transactional_id=tid, producer_id=self.allocate_producer_id(),
            producer_epoch=txn.MAX_PRODUCER_EPOCH - 2, previous_producer_id=txn.NO_PRODUCER_ID,
            previous_producer_epoch=-1, transaction_timeout_ms=TXN_TIMEOUT_MS_RANGE[0],
            state=txn.TxnState.COMPLETE_COMMIT, last_update_ms=self.now_ms, bump_reason="init",
        )
        self.txn_log.append([encode_txn(md)], expected_log_end_offset=0, writer="setup")

    def _new_coordinator(self, node_id: int) -> CoordinatorNode:
        incarnation = len(self.coordinators) + 1
        coordinator = CoordinatorNode(self, node_id, incarnation)
        self.coordinators.append(coordinator)
        return coordinator

    def _new_producer(self, tid: str) -> ProducerNode:
        instances = self.producers.setdefault(tid, [])
        timeout_ms = self.rng.randint(*TXN_TIMEOUT_MS_RANGE)
        two_phase = tid in self.two_phase_ids
        # An outside coordinator holding a prepared state takes over with
        # keep_prepared_txn; otherwise (a task retried) the new instance aborts.
        keep = two_phase and tid in self.handed and self.rng.random() < 0.7
        producer = ProducerNode(self, tid, len(instances) + 1, timeout_ms,
                                two_phase=two_phase, keep_prepared=keep)
        instances.append(producer)
        # At most three live instances per id: the oldest zombie dies.
        live = [p for p in instances if p.alive]
        for old in live[:-3]:
            old.alive = False
        self.log(f"{producer.name}: started (transaction timeout {timeout_ms} ms"
                 + (", two-phase commit" if two_phase else "")
                 + (", keeps a prepared transaction" if keep else "")
                 + (", the store adds its partitions" if producer.store_adds else "") + ")")
        return producer

    def _restartable(self) -> list[str]:
        """Transactional ids an application (or the outside coordinator of a
        two-phase commit) would start a new instance of: the newest one is
        dead or fatal, or a prepared state handed over is not being completed
        by any live instance."""
        out = []
        for tid, instances in self.producers.items():
            newest = instances[-1]
            handed = self.handed.get(tid)
            awaits_completion = handed is not None and self.completed.get(tid) != handed \
                and not any(p.alive and (p.status in (Status.PREPARED, Status.COMPLETING)
                                         or p.status is Status.INIT and p.keep_prepared)
                            for p in instances)
            if not newest.alive or newest.status is Status.FATAL or awaits_completion:
                out.append(tid)
        return out

    def live_producers(self) -> list[ProducerNode]:
        return [p for instances in self.producers.values() for p in instances if p.alive]

    # -- actions

    def _deliverable(self) -> list[int]:
        out = []
        for i, envelope in enumerate(self.network):
            if envelope.not_before_ms > self.now_ms:
                continue
            node = self.node(envelope.dst)
            if node is None or not node.alive or node.deliverable():
                out.append(i)
        return out

    def deliver(self, index: int) -> None:
        envelope = self.network.pop(index)
        node = self.node(envelope.dst)
        if node is None or not node.alive:
            self.log(f"m{envelope.msg_id} {envelope.src} -> {envelope.dst} dropped (dead): "
                     f"{show(envelope.payload)}")
            return
        self.log(f"deliver m{envelope.msg_id} {envelope.src} -> {envelope.dst}: "
                 f"{show(envelope.payload)}")
        node.receive(envelope.src, envelope.payload)

    def drop(self, index: int) -> None:
        envelope = self.network.pop(index)
        self.log(f"DROP m{envelope.msg_id} {envelope.src} -> {envelope.dst}: "
                 f"{show(envelope.payload)}")

    def delay(self, index: int) -> None:
        """Holds a message for long enough that its sender times out and
        retries, and maybe moves on to its next transaction."""
        envelope = self.network[index]
        # Heavy-tailed: a third of delayed messages outlive a few transactions.
        delay_ms = self.rng.randint(200, 5000) if self.rng.random() < 0.67 else \
            self.rng.randint(5000, 20_000)
        self.network[index] = Envelope(envelope.msg_id, envelope.src, envelope.dst,
                                       envelope.payload, self.now_ms + delay_ms)
        self.log(f"DELAY m{envelope.msg_id} by {delay_ms} ms: {show(envelope.payload)}")

    def duplicate(self, index: int) -> None:
        envelope = self.network[index]
        # Half the copies trail far behind (a retransmission stuck in a
        # queue): they arrive after the sender has moved on.
        held_ms = 0 if self.rng.random() < 0.5 else self.rng.randint(200, 5000)
        copy = Envelope(self.new_id(), envelope.src, envelope.dst, envelope.payload,
                        max(envelope.not_before_ms, self.now_ms + held_ms))
        self.network.append(copy)
        self.log(f"DUPLICATE m{envelope.msg_id} as m{copy.msg_id}"
                 + (f", held {held_ms} ms" if held_ms else ""))

    def advance(self, delta_ms: int) -> None:
        self.now_ms += delta_ms
        self.log(f"clock +{delta_ms} ms")
        for store in self.stores:
            if store.deliverable():
                store.expire_calls()
        for coordinator in self.coordinators:
            if coordinator.deliverable():
                coordinator.expire_calls()
        for producer in self.live_producers():
            if producer.deliverable():
                producer.expire_calls()

    def takeover(self) -> None:
        """The coordinator is replaced: the old process dies, or lives on as a
        zombie with its memory (a long pause, a partition)."""
        old = self.designated
        zombie = old.alive and self.faults_on and self.rng.random() < 0.5
        if not zombie:
            old.alive = False
        node_id = (old.node_id + 1) % self.coordinator_nodes
        self.designated = self._new_coordinator(node_id)
        live = [c for c in self.coordinators if c.alive]
        for stale in live[:-2]:
            stale.alive = False
        self.log(f"TAKEOVER: {old.name} {'lives on as a zombie' if zombie else 'dies'}; "
                 f"{self.designated.name} takes over")

    def crash_producer(self, tid: str) -> None:
        old = self.producers[tid][-1]
        zombie = old.alive and self.rng.random() < 0.5
        if zombie:
            old.zombie = True
        else:
            old.alive = False
        self.log(f"PRODUCER CRASH: {old.name} {'lives on as a zombie' if zombie else 'dies'}")
        self._new_producer(tid)

    def arm_txn_log_fault(self) -> None:
        landed = self.rng.random() < 0.5
        code = ErrorCode.REQUEST_TIMED_OUT if landed else ErrorCode.NETWORK_EXCEPTION
        self.txn_log.faults.append((code, landed))
        self.log(f"FAULT: the next transaction log append fails "
                 f"({'after' if landed else 'before'} landing)")

    def _actions(self) -> list[tuple[float, Callable[[], None]]]:
        rng = self.rng
        actions: list[tuple[float, Callable[[], None]]] = []
        deliverable = self._deliverable()
        if deliverable:
            actions.append((40, lambda: self.deliver(rng.choice(deliverable))))
            if self.faults_on:
                actions.append((3 * self.fault_scale,
                                lambda: self.drop(rng.choice(deliverable))))
                # Stale markers and data are what the epoch and dedup rules
                # are for: their requests are picked more often to trail behind.
                stale_prone = deliverable + [
                    i for i in deliverable
                    if isinstance(self.network[i].payload, (MarkerRequest, ProduceRequest))
                ] * 2
                actions.append((2 * self.fault_scale,
                                lambda: self.duplicate(rng.choice(stale_prone))))
                actions.append((2 * self.fault_scale, lambda: self.delay(rng.choice(stale_prone))))
        producers = [p for p in self.live_producers() if p.deliverable()]
        if producers:
            def act() -> None:
                rng.choice(producers).act(finishing=False)
            actions.append((25, act))
        flushable = [s for s in self.stores if s.pending and s.deliverable()]
        if flushable:
            def flush() -> None:
                store = rng.choice(flushable)
                store.flush(rng.randint(1, len(store.pending)))
            actions.append((10, flush))
        busy = [c for c in self.coordinators if c.has_work()]
        if busy:
            actions.append((12, lambda: rng.choice(busy).work()))
        timers = [c for c in self.coordinators if c.timer_due()]
        if timers:
            actions.append((10, lambda: rng.choice(timers).tick()))
        actions.append((8, lambda: self.advance(rng.randint(1, 120))))
        actions.append((0.25 * self.fault_scale, lambda: self.advance(rng.randint(500, 4000))))
        actions.append((0.5, lambda: rng.choice(self.stores).expire_producers()))
        restartable = self._restartable()
        if restartable:
            def restart() -> None:
                self._new_producer(rng.choice(restartable))
            actions.append((5, restart))
        if self.faults_on:
            scale = self.fault_scale
            actions.append((0.1 * scale, lambda: self.advance(rng.randint(20_000, 250_000))))
            actions.append((0.5 * scale, lambda: rng.choice(self.stores).crash()))
            actions.append((0.5, lambda: rng.choice(self.stores).snapshot()))
            actions.append((0.3 * scale, self.takeover))
            actions.append((0.3 * scale,
                            lambda: self.crash_producer(rng.choice(sorted(self.producers)))))
            actions.append((0.3 * scale, self.arm_txn_log_fault))
            if producers:
                def stall() -> None:
                    producer = rng.choice(producers)
                    timeout_ms = producer.transaction_timeout_ms
                    pause_ms = timeout_ms + rng.randint(0, timeout_ms)
                    producer.stalled_until_ms = self.now_ms + pause_ms
                    self.log(f"STALL: {producer.name} pauses for {pause_ms} ms")
                actions.append((0.2 * scale, stall))

            def pause_server() -> None:
                # A paused coordinator that is replaced meanwhile wakes up as a
                # zombie with its old memory and its marker tasks.
                node: Node = rng.choice([*self.stores, *[c for c in self.coordinators
                                                          if c.alive]])
                # Heavy-tailed: now and then long enough for stores to expire
                # idle producers meanwhile.
                pause_ms = rng.randint(200, 6000) if rng.random() < 0.9 else \
                    rng.randint(20_000, 200_000)
                node.stalled_until_ms = self.now_ms + pause_ms
                self.log(f"PAUSE: {node.name} for {pause_ms} ms")
            actions.append((0.2 * scale, pause_server))
            owner = self.owner()
            if owner.deliverable():
                actions.append((0.1 * scale, owner.admin_abort_random))
            zombies = [c for c in self.coordinators if c.alive and c is not self.designated]
            if zombies:
                def kill_zombie() -> None:
                    victim = rng.choice(zombies)
                    victim.alive = False
                    self.log(f"zombie {victim.name} dies")
                actions.append((0.3 * scale, kill_zombie))
        return actions

    def step(self) -> None:
        self.step_no += 1
        actions = self._actions()
        _weight, action = self.rng.choices(actions, weights=[w for w, _a in actions])[0]
        action()
        self.checker.check_step()

    # -- quiescence

    def _quiet(self) -> bool:
        if self.network or any(s.pending or s.gates for s in self.stores):
            return False
        coordinator = self.owner()
        if not coordinator.alive or not coordinator.loaded or coordinator.fenced:
            return False
        if any(c.alive and (c.tasks or c.held or (not c.loaded and not c.fenced))
               for c in self.coordinators):
            return False
        if any(md.state in (txn.TxnState.ONGOING, txn.TxnState.PREPARED,
                            txn.TxnState.PREPARE_EPOCH_FENCE) or md.state.is_prepare
               for md in coordinator.state.transactions.values()):
            return False
        for producer in self.live_producers():
            if producer.calls or producer.status in (
                Status.INIT, Status.IN_TXN, Status.COMMITTING, Status.ABORTING,
                Status.ABORTABLE, Status.PREPARING, Status.PREPARED, Status.COMPLETING,
            ):
                return False
        return True

    def quiesce(self) -> None:
        """Faults off, everything delivered, timers run: the run must settle."""
        self.faults_on = False
        self.log("QUIESCE: no more faults; delivering everything")
        for node in [*self.live_producers(), *self.stores, *self.coordinators]:
            node.stalled_until_ms = -1
        for _ in range(MAX_QUIESCE_STEPS):
            if self._quiet():
                self.log("quiescent")
                return
            self.step_no += 1
            self._quiesce_step()
            self.checker.check_step()
        raise SimViolation(f"no quiescence after {MAX_QUIESCE_STEPS} steps (a liveness bug): "
                           f"{self.describe_state()}")

    def _quiesce_step(self) -> None:
        rng = self.rng
        deliverable = self._deliverable()
        if deliverable:
            self.deliver(rng.choice(deliverable))
            return
        flushable = [s for s in self.stores if s.pending]
        if flushable:
            store = rng.choice(flushable)
            store.flush(len(store.pending))
            return
        busy = [c for c in self.coordinators if c.has_work()]
        if busy:
            rng.choice(busy).work()
            return
        timers = [c for c in self.coordinators if c.timer_due()]
        if timers:
            rng.choice(timers).tick()
            return
        owner = self.owner()
        if not owner.alive or owner.fenced:
            # Nobody can serve the partition: a supervisor starts a new process.
            self.takeover()
            return
        for producer in self.live_producers():
            if producer.act(finishing=True):
                return
        restartable = self._restartable()
        if restartable and rng.random() < 0.5:
            # An application restarts a dead instance; it will init and stop.
            self._new_producer(rng.choice(restartable))
            return
        self.advance(250)

    def settle(self, *, max_steps: int = 1000) -> None:
        """For directed scenarios: deliver every deliverable message, land
        every group commit and run every coordinator's background work, in
        order, without faults or clock movement, until nothing is left."""
        for _ in range(max_steps):
            deliverable = self._deliverable()
            if deliverable:
                self.deliver(deliverable[0])
                continue
            flushable = [s for s in self.stores if s.pending and s.deliverable()]
            if flushable:
                flushable[0].flush(len(flushable[0].pending))
                continue
            busy = [c for c in self.coordinators if c.has_work()]
            if busy:
                busy[0].work()
                continue
            return
        raise InvariantViolation(f"harness: not settled after {max_steps} steps")

    def describe_state(self) -> str:
        lines = [f"network: {[show(e.payload) for e in self.network][:10]}"]
        for store in self.stores:
            log = store.part.log
            lines.append(f"{store.name}: LSO {log.last_stable_offset} HW {log.high_watermark} "
                         f"LEO {log.log_end_offset} pending {len(store.pending)} "
                         f"gates {sorted(store.gates)}")
        for c in self.coordinators:
            states = {tid: f"{md.state.value}/e{md.producer_epoch}"
                      for tid, md in c.state.transactions.items()}
            lines.append(f"{c.name}: alive={c.alive} loaded={c.loaded} fenced={c.fenced} "
                         f"tasks={sorted(c.tasks)} {states}")
        for producer in self.live_producers():
            lines.append(f"{producer.name}: {producer.status.value} pid={producer.producer_id} "
                         f"e={producer.producer_epoch} calls={len(producer.calls)}")
        return "\n".join(lines)

    # -- run

    def run(self) -> None:
        for _ in range(self.steps):
            self.step()
        self.quiesce()
        self.checker.check_final()

    def summary(self) -> str:
        decided = len(self.ledger.decisions)
        commits = sum(1 for c in self.ledger.decisions.values() if c)
        records = sum(len(r.records) for data, r in self.ledger.txns.items()
                      if self.ledger.decisions_by_data.get(data))
        return (f"{len(self.stores)} partitions, {len(self.producers)} transactional ids, "
                f"{len(self.coordinators)} coordinator incarnations; {decided} decisions "
                f"({commits} commits, {records} committed records); "
                f"{self.step_no} steps, clock {self.now_ms - START_MS} ms")


def run_seed(seed: int, *, steps: int = DEFAULT_STEPS, verbose: bool = False) -> SimResult:
    """Runs one seed; a violation (or any crash of the code under test) is
    reported with the end of the trace."""
    sim = Simulation(seed, steps=steps, verbose=verbose)
    try:
        sim.run()
    except (SimViolation, InvariantViolation, ServiceError, AssertionError, Exception) as exc:
        sim.log(f"FAILED: {type(exc).__name__}: {exc}")
        return SimResult(seed, False, sim.step_no, f"{type(exc).__name__}: {exc}",
                         sim.trace.tail(TRACE_TAIL_LINES), sim.summary())
    return SimResult(seed, True, sim.step_no, "", "", sim.summary())


def _seed_range(text: str) -> range:
    first, sep, last = text.partition("..")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected A..B, got {text!r}")
    return range(int(first), int(last) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sim.sim",
        description="Seeded simulation of the coordinator and partition-store cores.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="replay one seed")
    which.add_argument("--seeds", type=_seed_range, help="run seeds A..B (inclusive)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"steps before quiescing (default {DEFAULT_STEPS})")
    parser.add_argument("--verbose", action="store_true", help="print every event")
    args = parser.parse_args(argv)
    if args.seed is not None:
        started = time.perf_counter()
        result = run_seed(args.seed, steps=args.steps, verbose=args.verbose)
        elapsed_s = time.perf_counter() - started
        if result.ok:
            print(f"seed {args.seed}: ok in {elapsed_s:.2f} s — {result.summary}")
            return 0
        if not args.verbose:
            print(result.trace_tail)
        print(f"\nseed {args.seed}: FAILED after {result.steps} steps: {result.error}\n"
              f"{result.summary}", file=sys.stderr)
        return 1
    failed: list[int] = []
    started = time.perf_counter()
    for seed in args.seeds:
        result = run_seed(seed, steps=args.steps)
        if not result.ok:
            failed.append(seed)
            print(f"seed {seed}: FAILED: {result.error.splitlines()[0][:300]}")
    elapsed_s = time.perf_counter() - started
    print(f"{len(args.seeds)} seeds, {len(failed)} failed, {elapsed_s:.1f} s"
          + (f"; failing seeds: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
