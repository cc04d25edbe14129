"""One seeded run of the production runtimes: setup, faults, quiesce, check.

Goal: FoundationDB's simulator / TigerBeetle's VOPR for oncelog. The real
`StoreRuntime`s, `TxnCoordinatorRuntime`s and `GroupCoordinatorRuntime`s,
unchanged, run on the deterministic loop (loop.py), talk through the
simulated network (network.py) and are driven by the SDK's own producer
logic (workload.py); one seed decides every delay, loss, crash and
interleaving, and an independent checker (checker.py) judges the outcome.

Method, per seed:

1. **Setup.** A layout of 2-3 stores, 1-2 transaction coordinators and 1-2
   group coordinators (the `__transaction_state` and `__consumer_offsets`
   partitions spread over them by the layout, every topic's partitions over
   the stores by `store_for`). Store 0 keeps the catalog; the data, input
   and output topics are created through it before anything else, and the
   input is written (15-40 records per partition, plain batches). Some
   seeds write one transactional id's record three bumps short of the
   epoch's end into the transaction log first (`_near_epoch_exhaustion`).
2. **Run** for `steps` loop iterations: producers of 2-4 transactional ids
   run transactions (some ids use two-phase commit, KIP-939: they prepare
   and hand the prepared state to an outside coordinator, `Handoff`), and
   1-2 copiers run the read-process-write loop from the input topic to the
   output topic, committing their input offsets in the group's
   `__consumer_offsets` within each transaction. A share of the
   transactional ids (not the two-phase-commit ones) run transaction
   version 1, as Kafka's clients do through the Kafka listener: their epoch
   stays across transactions, they recover from a failed write with KIP-360
   (workload.py). A producer instance that
   ends (fenced, failed, handed its prepared transaction over) is replaced
   by a new one, as a supervisor restarts a task. A fault task, at seeded
   intervals, crashes and restarts stores (recovery from the MemoryStore:
   snapshots + replay; what the group-commit writer had queued is lost;
   now and then right after the store sent an answer or as a request
   reaches it, `crash_after_reply`, `crash_on_request`),
   crashes any coordinator, replaces one (transaction or group) while the
   old process is paused (it later resumes as a zombie, a share of requests
   still reaching it, and eventually dies), pauses any node for a while,
   stalls a producer past its transaction timeout, starts a new instance
   of a transactional id (fencing the old one, which may keep running as a
   zombie), has an operator abort a transactional id's open transaction
   (AbortTransaction), and, on half the seeds, jumps the runtimes' wall
   clock ahead by minutes (transactions time out, idle producers and
   transactional ids expire). The network drops, duplicates and delays
   messages with per-seed odds, so a transaction-log append fails before
   or after it lands. A share of the seeds run a fault recipe instead of
   the extra workloads, which lines faults up in time for one kind of bug
   (`SLOW_CLIENT_ZOMBIE`, see `_after_add`).
3. **Quiesce**: faults off, a perfect network, every node up and every
   zombie dead, producers told to stop after their current transaction,
   copiers after their input is copied, prepared transactions completed by
   the outside coordinator; then simulated time runs on until every
   producer has finished and the coordinators' timers have ended what was
   left open. (A coordinator process fenced off its partitions by a zombie
   that finished loading after it is restarted, as a supervisor would.)
4. **Check**: the checker after every `check_every_steps` iterations and at
   the end (checker.py says what).

`replicated` runs the same on three replicated stores (RF 3, min ISR 2),
wired by services/partition_store/server.py's `wire()` with a client of one
shared in-memory metadata store (etcd) each and a `SimLeaderLink` through
the network; coordinators and clients follow leaders through Metadata.
Its faults add a machine crash that loses the writes since the disk's last
writeback (`SimDisk`), a wiped disk (both one at a time, while every replica
is in sync), a leader paused past its lease, network partitions around a
leader (from the other stores, the metadata store, or everyone), and the
metadata store out of reach; `checker.ReplicaChecker` judges the replicas'
logs. docs/testing.md, "Replicated stores".

`fsync` runs the stores with --fsync (the production writer's fsync runs
at a seeded moment on the loop: loop.py) on SimDisks, single copies too,
and adds machine crashes of any stores at any moment, several or every
one at once, whatever the replicas' state (`_power_loss_anywhere`); a
store's crash as a request arrives or right after it answered is its
machine's. Nothing acknowledged may be lost. docs/testing.md, "Machine
crashes with `--fsync`".

On half the seeds (`membership`) the copiers are members of their group
through the SDK's GroupMembership (workload.py, `Copier`): stalls and
pauses past their session remove them, the group rebalances, and their
stale TxnOffsetCommits are refused.

`bug` (tests only) runs with one deliberately broken piece, to show that the
checker catches it (see BUGS).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from oncelog import records
from oncelog.errors import ErrorCode, OncelogError
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import TRANSACTION_STATE_TOPIC, ClusterLayout
from services.common.metadata.store import MemoryMetadataStore
from services.coordinator.core import transactions as txn
from services.coordinator.core.producer_ids import DEFAULT_BLOCK_SIZE
from services.coordinator.core.txn_log import encode_txn
from services.coordinator.producer_id_manager import ProducerIdManager
from services.coordinator.txn_runtime import TxnConfig, TxnCoordinatorRuntime
from services.group_coordinator.core import groups as groups_module
from services.group_coordinator.core import offsets_log
from services.group_coordinator.runtime import GroupConfig, GroupCoordinatorRuntime
from services.partition_store import writer as writer_module
from services.partition_store.api import ProduceItem, TopicSpec
from services.partition_store.core import producer_state
from services.partition_store.core.outcomes import Rejection
from services.partition_store.core.replicas import NO_LEADER, PartitionState
from services.partition_store.core.topics import topic_record_from_json
from services.partition_store.log import partition as partition_module
from services.partition_store.log import reads as partition_reads_module
from services.partition_store.log.partition import PartitionRuntime
from services.partition_store.produce import Producing
from services.partition_store.replication import metadata_link as metadata_link_module
from services.partition_store.replication.fetcher import ReplicaFetcherManager
from services.partition_store.replication.metadata_link import DEFAULT_ROOT
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.server import Wired, wire
from services.partition_store.shared import StoreShared
from services.partition_store.storage.memory import MemoryStore
from tests.sim.real.checker import (
    Checker,
    GroupChecker,
    Ledger,
    ReplicaChecker,
    TxnLogView,
    Violation,
    input_value,
    run_now,
)
from tests.sim.real.loop import DeterministicLoop, SimulationStuck, new_loop
from tests.sim.real.network import (
    FaultProfile,
    Incarnation,
    Network,
    RpcTimeout,
    RpcUnavailable,
    SimControllerLink,
    SimDisk,
    SimLeaderLink,
    SimMarkerSender,
    SimProducerIdLog,
    SimStoreClient,
    SimTxnLog,
    SimTxnResolver,
    SimTxnVerifier,
    coordinator_name,
    group_coordinator_name,
    store_name,
)
from tests.sim.real.workload import Copier, Counters, Handoff, ProducerDone, TxnProducer

T = TypeVar("T")

DATA_TOPIC = "data"
# The read-process-write workload: copiers read INPUT_TOPIC (written once,
# at setup, by a plain producer) and write OUTPUT_TOPIC, committing their
# input offsets in group GROUP_ID within the same transactions.
INPUT_TOPIC = "input"
OUTPUT_TOPIC = "output"
GROUP_ID = "copiers"
DEFAULT_STEPS = 5_000
# A replicated run's loop turns over more often per simulated second (the
# replicas' fetches and metadata syncs), so it gets more iterations for about
# the same span of workload, and is checked every CHECK_EVERY_STEPS_REPLICATED.
DEFAULT_REPLICATED_STEPS = 20_000
CHECK_EVERY_STEPS = 25
CHECK_EVERY_STEPS_REPLICATED = 100
# How long quiescing may take in simulated time before the run counts as
# not settling (a liveness failure): long enough for every timeout to fire.
QUIESCE_LIMIT_S = 600.0
TRACE_TAIL_LINES = 60
# Fault recipes (see Simulation._after_add): the share of seeds that run one.
SLOW_CLIENT_ZOMBIE = "slow-client-zombie"
RECIPE_SHARE = 0.25
# Idle transactional ids are forgotten after this (a week by default),
# scaled down so that clock jumps of minutes make them expire.
TRANSACTIONAL_ID_EXPIRATION_MS = 180_000
# The coordinators' --max-transaction-timeout-ms, also the stores' bound on a
# transaction whose timeout they did not learn; and the stores'
# --hanging-txn-margin-ms, short so that the stores' questions about
# transactions open past their timeout race the coordinators' own timers
# (and clock jumps make many transactions overdue at once).
MAX_TRANSACTION_TIMEOUT_MS = 60_000
HANGING_TXN_MARGIN_MS = 2_000
# The share of seeds whose copiers are members of their group (KIP-848
# heartbeats, TxnOffsetCommit with member id and epoch); the others commit
# outside the group protocol (generation -1), as a transactional sink does.
MEMBERSHIP_SHARE = 0.5
# The share of transactional ids that run transaction version 1.
VERSION_1_SHARE = 0.4
# A producer id no block of the coordinators' hands out: the transactional id
# whose epoch starts near int16's end (`_near_epoch_exhaustion`).
EXHAUSTED_PRODUCER_ID = 1 << 40
# Replicated runs (`replicated=True`): three stores, every topic with three
# replicas and min.insync.replicas 2 (the defaults), a store's etcd lease
# and replica.lag.time.max.ms short enough that leaders move and ISRs
# shrink and grow within a run (tests/integration/test_replication.py uses
# the same).
REPLICATED_STORES = 3
LEASE_TTL_S = 2
REPLICA_LAG_TIME_MAX_MS = 3_000
# How often the controller moves leadership back to preferred replicas,
# drawn per seed: at once (a leader change right after each return to the
# ISR, the most interleavings), within a run, or never within one.
LEADER_IMBALANCE_CHECK_INTERVALS_MS = (0, 5_000, 300_000)
# etcd checks for expired leases about this often.
LEASE_CHECK_INTERVAL_S = 0.5
# The kernel writes a disk's page cache back this often, at the most (a
# machine crash loses what it wrote since).
WRITEBACK_INTERVAL_MS_MAX = 5_000
# A destructive fault (power loss, wipe) waits this long at most for every
# replica to be in sync.
IN_SYNC_WAIT_S = 60.0
# How long, after the workload ends, the replicas may take to be whole and
# in sync again before the run counts as not settling.
CONVERGE_LIMIT_S = 120.0


@contextlib.contextmanager
def _no_confirm_ownership() -> Iterator[None]:
    """Issue 3's bug: the coordinator answers a store's verification from
    memory without confirming that it still owns the partition."""
    original = TxnCoordinatorRuntime._confirm_ownership

    async def skip(self: TxnCoordinatorRuntime, owned: Any) -> None:
        del self, owned

    TxnCoordinatorRuntime._confirm_ownership = skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        TxnCoordinatorRuntime._confirm_ownership = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _ack_before_durable() -> Iterator[None]:
    """A store that answers a produce or a marker before its group commit
    has written it: a crash in between loses an acknowledged write."""
    original = StoreShared.await_durable

    async def skip(self: StoreShared, waits: Any, timeout_ms: int) -> dict[int, Any]:
        del self, waits, timeout_ms
        return {}

    StoreShared.await_durable = skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        StoreShared.await_durable = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_marker_epoch_check() -> Iterator[None]:
    """A store that writes a marker whose producer epoch is not above the
    producer's current one (transaction version 2's rule): a delayed marker
    of an earlier transaction then ends a later one."""
    original = producer_state.check_marker

    def unchecked(entry: Any, marker: Any, *, topic_partition: str) -> Any:
        decision = original(entry, marker, topic_partition=topic_partition)
        if isinstance(decision, Rejection) and decision.code is ErrorCode.INVALID_PRODUCER_EPOCH:
            return producer_state.WRITE_MARKER
        return decision

    producer_state.check_marker = unchecked
    try:
        yield
    finally:
        producer_state.check_marker = original


@contextlib.contextmanager
def _kafka_v1_marker_rule() -> Iterator[None]:
    """A store that applies Kafka's own rule to version-1 markers: any epoch
    at or above the producer's is written, with no timestamp to order them
    (and so no retry recognised): a delayed copy of an earlier
    transaction's marker then ends the producer's next transaction early."""
    original = producer_state.check_marker

    def kafka(entry: Any, marker: Any, *, topic_partition: str) -> Any:
        decision = original(entry, marker, topic_partition=topic_partition)
        if marker.is_version_1 and entry is not None and (
                isinstance(decision, producer_state.DuplicateMarker)
                or (isinstance(decision, Rejection)
                    and decision.code is ErrorCode.INVALID_PRODUCER_EPOCH
                    and marker.producer_epoch >= entry.producer_epoch)):
            return producer_state.WRITE_MARKER
        return decision

    producer_state.check_marker = kafka
    try:
        yield
    finally:
        producer_state.check_marker = original


@contextlib.contextmanager
def _offsets_on_abort() -> Iterator[None]:
    """A group coordinator that materializes a transaction's pending offsets
    whatever its marker says: an aborted transaction's offsets become the
    group's committed offsets, and its input is skipped."""
    original = offsets_log.OffsetsPartitionState._replay_marker

    def both(self: offsets_log.OffsetsPartitionState, batch: offsets_log.BatchView) -> None:
        original(self, dataclasses.replace(batch, control_type=records.MARKER_COMMIT))

    offsets_log.OffsetsPartitionState._replay_marker = both  # type: ignore[method-assign]
    try:
        yield
    finally:
        offsets_log.OffsetsPartitionState._replay_marker = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _patched(module: Any, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, replacement(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def _leaky_read_committed() -> contextlib.AbstractContextManager[None]:
    """A read_committed filter that ignores the aborted index: aborted
    records leak to readers."""
    def leaky(original: Callable[..., Any]) -> Callable[..., Any]:
        def select(stored: Any, **kwargs: Any) -> Any:
            return original(stored, **{**kwargs, "aborted": None})
        return select
    return _patched(partition_reads_module, "select_batches", leaky)


def _skip_verification() -> contextlib.AbstractContextManager[None]:
    """A store that skips the coordinator's verification of a producer's
    first transactional write to a partition: a write to a partition the
    transaction never added opens a transaction no marker will end."""
    def unverified(original: Callable[..., Any]) -> Callable[..., Any]:
        def check(entry: Any, header: Any, *, topic_partition: str,
                  txn_verified: bool = False, sequenced: bool = True) -> Any:
            del txn_verified
            return original(entry, header, topic_partition=topic_partition, txn_verified=True,
                            sequenced=sequenced)
        return check
    return _patched(producer_state, "check_append", unverified)


def _two_phase_timeout() -> contextlib.AbstractContextManager[None]:
    """A coordinator that times out two-phase-commit transactions like any
    other (KIP-939 says never)."""
    def any_timeout(_original: Callable[..., Any]) -> Callable[..., Any]:
        def timed_out(md: txn.TxnMetadata, now_ms: int) -> bool:
            return md.state is txn.TxnState.ONGOING and \
                now_ms >= md.txn_start_ms + md.transaction_timeout_ms
        return timed_out
    return _patched(txn, "is_timed_out", any_timeout)


def _complete_any_state() -> contextlib.AbstractContextManager[None]:
    """A coordinator that commits its prepared transaction whatever prepared
    state a CompleteTransaction names."""
    def always_matching(original: Callable[..., Any]) -> Callable[..., Any]:
        def plan(md: txn.TxnMetadata | None, **kwargs: Any) -> Any:
            if md is not None and md.state is txn.TxnState.PREPARED:
                kwargs["prepared"] = md.prepared_state
            return original(md, **kwargs)
        return plan
    return _patched(txn, "plan_complete_prepared", always_matching)


def _hw_ignores_followers() -> contextlib.AbstractContextManager[None]:
    """A leader that computes the high watermark from its own durable end
    only, ignoring its followers: it acknowledges what no other replica has,
    and loses it when it fails."""
    def own_end_only(_original: Callable[..., Any]) -> Callable[..., Any]:
        def high_watermark(*, current: int, leader_end_offset: int, **_others: Any) -> int:
            return max(current, leader_end_offset)
        return high_watermark
    return _patched(partition_module, "high_watermark", own_end_only)


def _no_follower_truncation() -> contextlib.AbstractContextManager[None]:
    """A follower that skips the truncation step when it starts following a
    new leader: it keeps a tail the new leader never had, and reports it to
    the leader as copied."""
    def skip(_original: Callable[..., Any]) -> Callable[..., Any]:
        async def truncate(self: ReplicaFetcherManager, part: Any, leader: int, epoch: int) -> None:
            del self, part, leader, epoch
        return truncate
    return _patched(ReplicaFetcherManager, "_truncate_to_leader", skip)


def _elect_outside_isr() -> contextlib.AbstractContextManager[None]:
    """A controller that elects a live replica outside the ISR when it has
    one (an unclean election the operator never asked for): the new leader
    lacks records the ISR had acknowledged."""
    def outside_first(original: Callable[..., Any]) -> Callable[..., Any]:
        def elect(state: PartitionState, live: Any, *, unclean: bool = False) -> Any:
            after = original(state, live, unclean=unclean)
            outside = [r for r in state.replicas if r in live and r not in state.isr]
            if after is None or not outside:
                return after
            leader = outside[0]
            isr = tuple(r for r in state.replicas if r == leader or (r in state.isr and r in live))
            return PartitionState(state.replicas, leader, state.leader_epoch + 1, isr)
        return elect
    return _patched(metadata_link_module, "elect_leader", outside_first)


def _append_after_leadership_moved() -> contextlib.AbstractContextManager[None]:
    """A store that appends a batch which waited for its transaction's
    verification without checking that it still leads the partition: the
    batch lands in a follower's log, where the leader never has it."""
    def unchecked(_original: Callable[..., Any]) -> Callable[..., Any]:
        def still_leading(self: Producing, part: Any, item: Any) -> None:
            del self, part, item
        return still_leading
    return _patched(Producing, "_check_still_leading", unchecked)


def _no_member_check() -> contextlib.AbstractContextManager[None]:
    """A group coordinator that takes any member's offset commit, whatever
    its member id, epoch or partitions: a copier removed from the group
    (a stall past its session) commits input that another member, given
    the partition, copies too."""
    def anyone(_original: Callable[..., Any]) -> Callable[..., Any]:
        def check(group: Any, **_kwargs: Any) -> dict[Any, ServiceError]:
            del group
            return {}
        return check
    return _patched(groups_module, "check_commit_member", anyone)


def _fsync_ignored() -> contextlib.AbstractContextManager[None]:
    """A group-commit writer that takes `--fsync` and never syncs: it
    acknowledges writes that only the page cache holds, which a machine
    crash loses."""
    def never_syncs(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(self: writer_module.GroupCommitWriter, store: Any, *, fsync: bool) -> None:
            del fsync
            original(self, store, fsync=False)
        return init
    return _patched(writer_module.GroupCommitWriter, "__init__", never_syncs)


# Deliberately broken runtimes for the "checker has teeth" tests.
BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "no-confirm-ownership": _no_confirm_ownership,
    "ack-before-durable": _ack_before_durable,
    "no-marker-epoch-check": _no_marker_epoch_check,
    "kafka-v1-marker-rule": _kafka_v1_marker_rule,
    "offsets-on-abort": _offsets_on_abort,
    "no-member-check": _no_member_check,
    "leaky-read-committed": _leaky_read_committed,
    "skip-verification": _skip_verification,
    "two-phase-timeout": _two_phase_timeout,
    "complete-any-state": _complete_any_state,
    # Replication's (caught in replicated runs: test_replicated_sim.py).
    "hw-ignores-followers": _hw_ignores_followers,
    "no-follower-truncation": _no_follower_truncation,
    "elect-outside-isr": _elect_outside_isr,
    "append-after-leadership-moved": _append_after_leadership_moved,
    # Durability's (caught in --fsync runs, whose machine crashes strike
    # any store at any moment: test_fsync_sim.py).
    "fsync-ignored": _fsync_ignored,
}
REPLICATION_BUGS = frozenset({"hw-ignores-followers", "no-follower-truncation",
                              "elect-outside-isr", "append-after-leadership-moved"})
FSYNC_BUGS = frozenset({"fsync-ignored"})


def _store_count(drawn: int, *, replicated: bool) -> int:
    """A replicated run has three stores (every topic three replicas); a
    single-copy run the number it drew (drawn either way, so both modes
    draw alike)."""
    return REPLICATED_STORES if replicated else drawn


@contextlib.contextmanager
def broken(bug: str | None) -> Iterator[None]:
    """Runs the block with BUGS[bug] patched in (None: the real code)."""
    with BUGS[bug]() if bug else contextlib.nullcontext():
        yield


@dataclass(slots=True)
class SimResult:
    seed: int
    steps_asked: int
    steps: int
    ok: bool
    failure: str = ""
    trace_tail: str = ""
    simulated_s: float = 0.0
    wall_s: float = 0.0
    messages: int = 0
    committed: int = 0
    aborted: int = 0
    fenced: int = 0
    checks: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    # The stores' disk syncs (the writer's fsyncs; 0 without --fsync).
    disk_syncs: int = 0
    # Member copiers: joins, and offset commits refused as a stale member's.
    joins: int = 0
    member_refusals: int = 0

    def summary(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.faults.items()))
        syncs = f", {self.disk_syncs} fsyncs" if self.disk_syncs else ""
        if self.joins:
            syncs += f", {self.joins} joins, {self.member_refusals} member commits refused"
        return (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} {self.steps} steps, "
                f"{self.simulated_s:.0f} s simulated in {self.wall_s:.2f} s, "
                f"{self.messages} messages, {self.committed} committed, {self.aborted} "
                f"aborted, {self.fenced} producers ended{syncs}, faults: {faults or 'none'}")


class Simulation:
    def __init__(self, seed: int, *, steps: int | None = None,
                 check_every_steps: int | None = None,
                 faults: bool = True, verbose: bool = False, fifo: bool = False,
                 layout: ClusterLayout | None = None, data_partitions: int | None = None,
                 copiers: int | None = None, replicated: bool = False,
                 fsync: bool = False, membership: bool | None = None,
                 converge_limit_s: float = CONVERGE_LIMIT_S) -> None:
        self.seed = seed
        # The stores run with --fsync (the writer syncs each group commit
        # before acknowledging it), their disks lose what was not synced
        # when their machine crashes, and machine crashes strike any store
        # at any moment, several or all at once (`_power_loss`).
        self.fsync = fsync
        self.converge_limit_s = converge_limit_s
        # Replicated stores (Kafka's ISR protocol, metadata in one shared
        # in-memory etcd); else single copies placed by the layout.
        self.replicated = replicated
        # A fault recipe: a pattern of faults aimed at one kind of bug, for a
        # share of the seeds (drawn apart from the run's generator, so the
        # other seeds run as they did before recipes existed). A recipe seed
        # runs the plain workload only (no copiers, no two-phase commit, no
        # clock jumps or admin aborts), which would end its pattern early.
        self.recipe = (SLOW_CLIENT_ZOMBIE if faults
                       and random.Random(f"recipe {seed}").random() < RECIPE_SHARE else None)
        self.steps = steps if steps is not None else default_steps(replicated=replicated)
        self.check_every_steps = check_every_steps or (
            CHECK_EVERY_STEPS_REPLICATED if replicated else CHECK_EVERY_STEPS)
        self.with_faults = faults
        self.verbose = verbose
        self.loop, self.rng = new_loop(seed, fifo=fifo)
        self.trace_lines: deque[str] = deque(maxlen=TRACE_TAIL_LINES)
        self.net = Network(self.loop, self.rng, self.trace)
        self.loop.expected_errors += (ServiceError, OncelogError, RpcTimeout, RpcUnavailable,
                                      ProducerDone)
        rng = self.rng
        self.layout = layout or ClusterLayout(
            stores=tuple(f"store-{i}:0" for i in range(
                _store_count(rng.randint(2, 3), replicated=replicated))),
            coordinators=tuple(f"coordinator-{i}:0" for i in range(rng.randint(1, 2))),
            transaction_state_partitions=rng.randint(1, 3),
            consumer_offsets_partitions=1,
        )
        self.data_partitions = data_partitions or rng.randint(2, 4)
        # The read-process-write workload's size, drawn apart from the run's
        # generator (so the rest of a seed draws as before it existed).
        copy_rng = random.Random(f"copiers {seed}")
        self.copiers = (copy_rng.randint(1, 2) if self.recipe is None else 0) \
            if copiers is None else copiers
        if self.copiers and not self.layout.group_coordinators:
            self.layout = dataclasses.replace(
                self.layout,
                group_coordinators=tuple(f"group-coordinator-{i}:0"
                                         for i in range(copy_rng.randint(1, 2))),
                consumer_offsets_partitions=copy_rng.randint(1, 2))
        self.input_partitions = copy_rng.randint(2, 3)
        self.input_records = [copy_rng.randint(15, 40) for _ in range(self.input_partitions)]
        # Copiers that are members of their group (drawn apart, like the rest
        # of the copiers' setup): all of a seed's or none, since a group with
        # members refuses commits from outside the protocol.
        # (A script that drives its copier step by step says False.)
        self.membership = bool(self.copiers) and (random.Random(
            f"membership {seed}").random() < MEMBERSHIP_SHARE if membership is None
            else membership)
        self.disks: list[MemoryStore | SimDisk] = [
            SimDisk() if replicated or fsync else MemoryStore() for _ in self.layout.stores]
        # A wiped store is not back in sync yet (an --fsync machine crash
        # waits for it: three failures at once, which nothing survives).
        self._wipe_unrecovered = False
        # The metadata store (etcd) of a replicated run, on the loop's clock
        # (its own, which the runtimes' clock jumps do not move). This
        # client is the harness's (the checker's reads, lease expiry); each
        # store process gets a client of its own.
        self.metadata = MemoryMetadataStore(clock_ms=self.loop.now_ms)
        self._metadata_clients: dict[int, MemoryMetadataStore] = {}
        self._metadata_up = True
        # Stores cut off from the metadata store by a network partition.
        self._metadata_cut: set[int] = set()
        # A destructive fault waits for every replica to be in sync.
        self._destructive_pending = False
        # (topic, partition) -> (mod revision, state) last read by the harness.
        self._states_read: dict[tuple[str, int], tuple[int, PartitionState]] = {}
        self.ledger = Ledger()
        self.counters = Counters()
        self.txn_log = TxnLogView(self.layout.transaction_state_partitions, self._store_for,
                                  replicated=replicated)
        self.checker = Checker(self.ledger, DATA_TOPIC, self.data_partitions, self._store_of,
                               self.txn_log, replicated=replicated)
        self.output_checker = Checker(self.ledger, OUTPUT_TOPIC, self.input_partitions,
                                      lambda p: self._store_for(OUTPUT_TOPIC, p), self.txn_log,
                                      replicated=replicated)
        self.replica_checker = ReplicaChecker(
            topics=self._replicated_topics, state_of=self._partition_state,
            replica_of=self._replica_of)
        self.group_checker = GroupChecker(
            self.ledger, group_id=GROUP_ID, input_topic=INPUT_TOPIC,
            inputs=[[input_value(p, i) for i in range(n)]
                    for p, n in enumerate(self.input_records)] if self.copiers else [],
            output=self.output_checker, layout=self.layout,
            store_for=self._store_for, group_coordinator=self._group_coordinator_of)
        self.producers: list[TxnProducer] = []
        # Two-phase-commit transactional ids (KIP-939) and their outside
        # coordinator (drawn apart from the run's generator).
        two_phase_rng = random.Random(f"two-phase {seed}")
        self.two_phase_ids = {f"txn-{i}" for i in range(4)
                              if faults and self.recipe is None
                              and two_phase_rng.random() < 0.4}
        # Transactional ids that run transaction version 1 (Kafka's clients),
        # drawn apart from the run's generator; not the two-phase-commit ones.
        version_rng = random.Random(f"version-1 {seed}")
        self.version_1_ids = {
            tid for tid in (*(f"txn-{i}" for i in range(4)), *(f"copier-{i}" for i in range(2)))
            if version_rng.random() < VERSION_1_SHARE and tid not in self.two_phase_ids}
        self.handoff = Handoff()
        self.fault_counts: dict[str, int] = {}
        self._incarnations = 0
        # Armed from the start: the recipe needs about a minute, and a run
        # quiesces after a minute or two.
        self._slow_client_armed = self.recipe == SLOW_CLIENT_ZOMBIE
        self._quiescing = False
        self._failure: Violation | None = None
        # The wall clock the runtimes read (now_ms): the loop's clock plus
        # the jumps injected so far (NTP steps, a suspended machine).
        self.clock_offset_ms = 0
        # Some seeds start one transactional id three bumps short of the
        # epoch's end, so its bumps rotate the producer id.
        self.near_exhaustion = faults and self.recipe is None \
            and random.Random(f"epochs {seed}").random() < 0.3
        self.leader_imbalance_check_interval_ms = random.Random(
            f"rebalance {seed}").choice(LEADER_IMBALANCE_CHECK_INTERVALS_MS)

    def _version_of(self, transactional_id: str) -> txn.TransactionVersion:
        return (txn.TransactionVersion.V1 if transactional_id in self.version_1_ids
                else txn.TransactionVersion.V2)

    def _txn_open(self, transactional_id: str, producer: tuple[int, int]) -> bool:
        """Whether the durable transaction log (read now, whole) holds an
        open transaction of that producer."""
        return self.txn_log.refresh() and self.txn_log.open_txn(transactional_id, producer)

    def clock_ms(self) -> int:
        return self.loop.now_ms() + self.clock_offset_ms

    # -------------------------------------------------------------- tracing

    def trace(self, line: str) -> None:
        entry = f"#{self.loop.steps} t={self.loop.now_ms()} {line}"
        self.trace_lines.append(entry)
        if self.verbose:
            print(entry)

    def _fault(self, kind: str, line: str) -> None:
        self.fault_counts[kind] = self.fault_counts.get(kind, 0) + 1
        self.trace(f"{kind.upper()} {line}")

    # --------------------------------------------------------------- nodes

    def _new_incarnation(self, name: str) -> Incarnation:
        self._incarnations += 1
        inc = Incarnation(self.loop, name, self._incarnations)
        return inc

    def _store_of(self, partition: int) -> StoreRuntime | None:
        return self._store_for(DATA_TOPIC, partition)

    def _store_for(self, topic: str, partition: int) -> StoreRuntime | None:
        """The live store runtime holding the partition (its leader, by the
        metadata store, on a replicated run), once it knows it."""
        if self.replicated:
            state = self._partition_state(topic, partition)
            if state is None or state.leader == NO_LEADER:
                return None
            node_id = state.leader
        else:
            node_id = self.layout.store_for(topic, partition)
        node = self.net.current(store_name(node_id))
        runtime = node.runtime
        if node.dead or not isinstance(runtime, StoreRuntime):
            return None
        try:
            runtime.partition(topic, partition)  # known to this store yet?
        except Exception:
            return None
        return runtime

    # ------------------------------------------------- replicated: metadata

    def _partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """A partition's replicas, leader, epoch and ISR as the metadata
        store holds them (the harness's own client: never cut off)."""
        found = run_now(self.metadata.get(f"{DEFAULT_ROOT}/partitions/{topic}/{partition}"))
        if found is None:
            return None
        cached = self._states_read.get((topic, partition))
        if cached is None or cached[0] != found.mod_revision:
            cached = (found.mod_revision, PartitionState.from_json(found.value))
            self._states_read[(topic, partition)] = cached
        return cached[1]

    def _leads(self, node_id: int, topic: str, partition: int) -> bool:
        """Whether store `node_id` leads the partition now, by the metadata store."""
        state = self._partition_state(topic, partition)
        return state is not None and state.leader == node_id

    def _replicated_topics(self) -> dict[str, tuple[int, bool]]:
        """Every topic of the metadata store's catalog: (partitions, compacted?)."""
        if not self.replicated:
            return {}
        read = run_now(self.metadata.get_prefix(f"{DEFAULT_ROOT}/topics/"))
        if read is None:
            return {}
        records = [topic_record_from_json(item.value) for item in read[0].values()]
        return {r.name: (r.partitions, r.compacted) for r in records}

    def _replica_of(self, node_id: int, topic: str, partition: int) -> PartitionRuntime | None:
        """Store `node_id`'s replica of the partition, while the node runs."""
        inc = self.net.current(store_name(node_id))
        runtime = inc.runtime
        if inc.dead or not inc.serving or not isinstance(runtime, StoreRuntime):
            return None
        try:
            part = runtime.partition(topic, partition)
        except ServiceError:
            return None
        return None if part.closed else part

    def _group_coordinator_of(self, node_id: int) -> GroupCoordinatorRuntime | None:
        node = self.net.current(group_coordinator_name(node_id))
        runtime = node.runtime
        if node.dead or node.paused or not isinstance(runtime, GroupCoordinatorRuntime):
            return None
        return runtime

    def start_store(self, node_id: int) -> Incarnation:
        """A store process, wired as services/partition_store/server.py wires
        every deployment (`wire`), with the simulation's ports: the network
        for the links to coordinators, the catalog's owner and the leaders,
        the node's disk, and on a replicated run a client of the shared
        metadata store."""
        inc = self._new_incarnation(store_name(node_id))
        config = StoreConfig(
            node_id=node_id, layout=self.layout, snapshot_interval_batches=20,
            snapshot_interval_ms=5_000, retention_check_interval_ms=3_000,
            producer_id_expiration_ms=15_000, catalog_refresh_interval_ms=2_000,
            replicated=self.replicated, replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS,
            max_transaction_timeout_ms=MAX_TRANSACTION_TIMEOUT_MS,
            hanging_txn_margin_ms=HANGING_TXN_MARGIN_MS, fsync=self.fsync,
        )
        verifier = SimTxnVerifier(self.net, inc, self.layout)
        resolver = SimTxnResolver(self.net, inc, self.layout)
        if self.replicated:
            client = self.metadata.another_client()
            client.set_available(self._metadata_up and node_id not in self._metadata_cut)
            self._metadata_clients[node_id] = client
            wired = wire(self.disks[node_id], config, metadata=client, lease_ttl_s=LEASE_TTL_S,
                         leader_imbalance_check_interval_ms=(
                             self.leader_imbalance_check_interval_ms),
                         txn_verifier=verifier, txn_resolver=resolver,
                         leaders=SimLeaderLink(self.net, inc),
                         clock_ms=self.clock_ms)
        else:
            wired = wire(self.disks[node_id], config, txn_verifier=verifier,
                         txn_resolver=resolver,
                         controller=SimControllerLink(self.net, inc, self.layout),
                         clock_ms=self.clock_ms)
        inc.runtime = wired.runtime
        self.net.add(inc)
        inc.spawn(self._serve_store(inc, wired))
        self.trace(f"start {inc}")
        return inc

    async def _serve_store(self, inc: Incarnation, wired: Wired) -> None:
        """Starts the wired store; it serves once started, as the real server
        listens only then. A start that fails (the metadata store out of
        reach) ends the process, and a supervisor starts it again."""
        try:
            await wired.start()
        except ServiceError as exc:
            self.trace(f"{inc} failed to start: {exc.code.name}")
            node_id = int(inc.name.rpartition("-")[2])
            harness = contextvars.Context()  # not the dying process's
            self.loop.call_soon(self._kill, inc, context=harness)
            self.loop.call_later(self.rng.randint(500, 3_000) / 1000, self._restart_store,
                                 node_id, context=harness)
            return
        inc.serving = True

    def start_coordinator(self, node_id: int) -> Incarnation:
        inc = self._new_incarnation(coordinator_name(node_id))
        client = SimStoreClient(self.net, inc, self.layout, follow_leaders=self.replicated)
        runtime = TxnCoordinatorRuntime(
            layout=self.layout, node_id=node_id,
            txn_log=SimTxnLog(client, self.clock_ms),
            markers=SimMarkerSender(self.net, inc, self.layout,
                                    follow_leaders=self.replicated),
            producer_ids=ProducerIdManager(SimProducerIdLog(client, self.clock_ms),
                                           node_id=node_id, block_size=DEFAULT_BLOCK_SIZE),
            now_ms=self.clock_ms,
            config=TxnConfig(max_transaction_timeout_ms=MAX_TRANSACTION_TIMEOUT_MS,
                             check_interval_ms=1_000,
                             transactional_id_expiration_ms=TRANSACTIONAL_ID_EXPIRATION_MS,
                             allow_two_phase_commit=True),
        )
        inc.runtime = runtime
        self.net.add(inc)
        inc.spawn(runtime.start())
        self.trace(f"start {inc}")
        return inc

    def start_group_coordinator(self, node_id: int) -> Incarnation:
        inc = self._new_incarnation(group_coordinator_name(node_id))
        runtime = GroupCoordinatorRuntime(
            layout=self.layout, node_id=node_id,
            store=SimStoreClient(self.net, inc, self.layout, follow_leaders=self.replicated),
            now_ms=self.clock_ms,
            config=GroupConfig(session_check_interval_ms=1_000,
                               retention_check_interval_ms=60_000, tail_wait_ms=1_000),
        )
        inc.runtime = runtime
        self.net.add(inc)
        inc.spawn(runtime.start())
        self.trace(f"start {inc}")
        return inc

    def start_copier(self, index: int, instance: int, *, run: bool = True) -> Copier:
        """Copier `index` owns the input partitions p with p % copiers == index."""
        transactional_id = f"copier-{index}"
        inc = self._new_incarnation(f"producer-{transactional_id}")
        self.net.add(inc)
        copier = Copier(
            group_id=GROUP_ID, input_topic=INPUT_TOPIC,
            input_partitions=[p for p in range(self.input_partitions)
                              if p % self.copiers == index],
            output_partitions=self.input_partitions,
            me=inc, net=self.net, loop=self.loop, rng=self.rng, layout=self.layout,
            ledger=self.ledger, transactional_id=transactional_id, instance=instance,
            topic=OUTPUT_TOPIC, counters=self.counters, trace=self.trace,
            txn_open=self._txn_open, follow_leaders=self.replicated,
            leads=self._leads if self.replicated else None,
            transaction_version=self._version_of(transactional_id),
            membership=self.membership, input_copied=self._input_copied,
        )
        inc.runtime = copier
        self.producers.append(copier)
        if run:
            inc.spawn(self._run_instance(copier))
        else:
            copier.done = True
        self.trace(f"start {copier}")
        return copier

    async def _run_instance(self, producer: TxnProducer) -> None:
        """Runs a producer instance; when it ends (fenced, failed) while it is
        the newest of its transactional id, the application starts another
        one a little later (as a supervisor restarts a crashed task)."""
        await producer.run(max_txns=1_000)
        await asyncio.sleep(self.rng.randint(500, 5_000) / 1000)
        self._replace_ended(producer)

    def _replace_ended(self, producer: TxnProducer) -> None:
        """Starts a new instance of the producer's transactional id unless
        another one is running, or there is nothing left for one to do."""
        tid = producer.transactional_id
        instances = [p for p in self.producers if p.transactional_id == tid]
        if any(not p.done and not p.me.dead for p in instances):
            return
        if isinstance(producer, Copier):
            if producer.stop_requested and producer.drained():
                return
        elif producer.stop_requested and self.handoff.pending(tid) is None:
            return
        self._start_instance(tid, 1 + max(p.instance for p in instances))

    def _start_instance(self, transactional_id: str, instance: int) -> TxnProducer:
        if transactional_id.startswith("copier-"):
            copier = self.start_copier(int(transactional_id.split("-")[1]), instance)
            if self._quiescing:
                copier.stop_requested = True
            return copier
        # Quiescing, the outside coordinator completes what it holds.
        producer = self.start_producer(
            transactional_id, instance,
            keep_prepared=(True if self._quiescing and transactional_id in self.two_phase_ids
                           else None))
        if self._quiescing:
            producer.stop_requested = True
        return producer

    def start_producer(self, transactional_id: str, instance: int, *,
                       run: bool = True, keep_prepared: bool | None = None) -> TxnProducer:
        """A producer instance of the transactional id; `run`: it runs
        transactions by itself (else a script drives it, step by step, from
        tasks of its own incarnation: `producer.me.spawn(...)`)."""
        inc = self._new_incarnation(f"producer-{transactional_id}")
        self.net.add(inc)
        producer = TxnProducer(
            me=inc, net=self.net, loop=self.loop, rng=self.rng, layout=self.layout,
            ledger=self.ledger, transactional_id=transactional_id, instance=instance,
            topic=DATA_TOPIC, partitions=self.data_partitions, counters=self.counters,
            trace=self.trace, after_add=self._after_add, txn_open=self._txn_open,
            handoff=self.handoff if transactional_id in self.two_phase_ids else None,
            keep_prepared=(keep_prepared if keep_prepared is not None else (
                transactional_id in self.two_phase_ids
                and self.handoff.pending(transactional_id) is not None
                and self.rng.random() < 0.7)),
            follow_leaders=self.replicated, leads=self._leads if self.replicated else None,
            transaction_version=self._version_of(transactional_id),
        )
        inc.runtime = producer
        self.producers.append(producer)
        if run:
            inc.spawn(self._run_instance(producer))
        else:
            producer.done = True  # nothing for quiescing to wait for
        self.trace(f"start {producer}")
        return producer

    # -------------------------------------------------------------- faults

    def _pick_faults(self) -> None:
        rng = self.rng
        if not self.with_faults:
            return
        # A replicated run sends several times more messages (the followers'
        # fetches, twice a second per replica when idle), so a message is
        # lost or slow, and a store dies on one, at lower odds: a lost fetch
        # stalls its follower for the RPC's whole deadline (10.5 s).
        crash_odds = [0.0, 0.0003, 0.001] if self.replicated else [0.0, 0.002, 0.005]
        drop_odds = [0.0, 0.002, 0.005, 0.01] if self.replicated else [0.0, 0.01, 0.03, 0.08]
        slow_odds = [0.0, 0.002, 0.01] if self.replicated else [0.0, 0.01, 0.05]
        self.net.faults = FaultProfile(
            drop=rng.choice(drop_odds),
            duplicate=rng.choice([0.0, 0.01, 0.05]),
            slow=rng.choice(slow_odds),
            zombie_route=rng.choice([0.2, 0.5]),
            crash_after_reply=rng.choice(crash_odds),
            crash_on_request=rng.choice(crash_odds),
        )
        self.net.on_store_crash = self._crash_store_now
        if self.recipe == SLOW_CLIENT_ZOMBIE:
            self.net.faults.zombie_route = rng.choice([0.5, 0.9])
        self.trace(f"faults {self.net.faults} recipe {self.recipe}")

    async def _faults(self) -> None:
        rng = self.rng
        actions: list[Callable[[], None]] = [
            self._crash_store, self._replace_coordinator, self._pause_node,
            self._stall_producer, self._new_producer_instance, self._crash_coordinator,
        ]
        if self.recipe is None:
            actions.append(self._admin_abort)
            if rng.random() < 0.5:
                actions.append(self._jump_clock)
        if self.recipe == SLOW_CLIENT_ZOMBIE:
            actions += [self._arm_slow_client] * 2
        if self.fsync and not self.replicated:
            actions += [self._power_loss] * 2
        if self.replicated:
            # Replication's own faults, as often as all the others together.
            actions += [self._power_loss, self._wipe_store, self._pause_leader,
                        self._partition_leader, self._metadata_outage] * 2
        if self.replicated:
            # A destructive fault needs every replica in sync, which lost and
            # delayed fetches keep from lasting: most seeds begin with one,
            # while the cluster still is.
            first = rng.choice([self._power_loss, self._wipe_store, None])
            if first is not None:
                await asyncio.sleep(rng.randint(500, 8_000) / 1000)
                first()
        while not self._quiescing:
            await asyncio.sleep(rng.randint(2_000, 15_000) / 1000)
            if self._quiescing:
                return
            rng.choice(actions)()

    # ------------------------------------------------- replicated: faults

    def _start_timers(self) -> None:
        """What goes on by itself: etcd ends leases past their TTL (by the
        loop's clock; replicated runs), and each machine's kernel writes its
        page cache back every few seconds (a SimDisk's)."""
        harness = contextvars.Context()

        def expire_leases() -> None:
            self.metadata.expire_leases()
            self.loop.call_later(LEASE_CHECK_INTERVAL_S, expire_leases, context=harness)

        def writeback(node_id: int) -> None:
            disk = self.disks[node_id]
            if isinstance(disk, SimDisk):
                disk.flush()
            self.loop.call_later(self.rng.randint(200, WRITEBACK_INTERVAL_MS_MAX) / 1000,
                                 writeback, node_id, context=harness)

        if self.replicated:
            expire_leases()
        for node_id in range(len(self.layout.stores)):
            writeback(node_id)

    def _all_in_sync(self) -> bool:
        """Every store serves, and every partition has a leader that leads
        at its epoch and all its replicas in the ISR."""
        if any(not self.net.current(store_name(n)).serving or self.net.current(
                store_name(n)).dead for n in range(len(self.layout.stores))):
            return False
        topics = self._replicated_topics()
        if not topics:
            return False
        for topic, (partitions, _compacted) in topics.items():
            for partition in range(partitions):
                state = self._partition_state(topic, partition)
                if state is None or not state.online or set(state.isr) != set(state.replicas):
                    return False
                leader = self._replica_of(state.leader, topic, partition)
                if leader is None or not leader.is_leader \
                        or leader.state.leader_epoch != state.leader_epoch:
                    return False
        return True

    def _converged(self) -> bool:
        """All in sync, and every replica at its leader's log end and HW."""
        if not self._all_in_sync():
            return False
        for topic, (partitions, _compacted) in self._replicated_topics().items():
            for partition in range(partitions):
                state = self._partition_state(topic, partition)
                assert state is not None  # noqa: S101 - _all_in_sync read it
                ends = set()
                for replica in state.replicas:
                    part = self._replica_of(replica, topic, partition)
                    if part is None:
                        return False
                    ends.add((part.log.log_end_offset, part.log.high_watermark))
                if len(ends) != 1 or len({*next(iter(ends))}) != 1:
                    return False
        return True

    def _leaders(self) -> list[int]:
        """Store nodes that lead some partition now (by the metadata store)."""
        leading = set()
        for topic, (partitions, _compacted) in self._replicated_topics().items():
            for partition in range(partitions):
                state = self._partition_state(topic, partition)
                if state is not None and state.online:
                    leading.add(state.leader)
        return sorted(leading)

    def _power_loss(self) -> None:
        """A store's machine crashes: the writes since its disk's last
        writeback are lost, but for a prefix. One failure at a time: it
        waits until every partition has all three replicas in sync (with RF 3
        and min.insync.replicas 2, nothing acknowledged may be lost then).
        With --fsync, at once, and one, several or every store's machine
        (`_power_loss_anywhere`)."""
        if self.fsync:
            self._power_loss_anywhere()
            return
        self._when_in_sync("power loss", self._lose_power)

    def _power_loss_anywhere(self) -> None:
        """--fsync: the machines of some stores (often all of them) crash at
        the same moment, whatever the replicas' state: each disk keeps what
        was synced and a prefix of the writes since. The writer synced
        everything it acknowledged, so nothing acknowledged may be lost.
        Not while a wiped store is still catching up: that would be more
        failures at once than any replication survives."""
        if self._wipe_unrecovered:
            if not self._all_in_sync():
                self.trace("power loss skipped: a wiped store is not back in sync")
                return
            self._wipe_unrecovered = False
        stores = len(self.layout.stores)
        count = stores if self.rng.random() < 0.4 else self.rng.randint(1, stores)
        struck = sorted(self.rng.sample(range(stores), count))
        if self.rng.random() < 0.5:
            for node_id in struck:
                self._cut_power(node_id)
            return
        # Aimed: at the next write to one of their disks, before the writer
        # syncs it (its sync is a timer, later than the next step); a random
        # moment mostly finds every write synced already. Or in 2 s anyway.
        harness = contextvars.Context()
        fired = False

        def strike(why: str) -> None:
            nonlocal fired
            if fired or self._quiescing:
                return
            fired = True
            for node_id in struck:
                disk = self.disks[node_id]
                if isinstance(disk, SimDisk):
                    disk.on_next_write = None
            self.trace(f"power loss {why}")
            for node_id in struck:
                self._cut_power(node_id)

        def arm(node_id: int) -> Callable[[], None]:
            def written() -> None:
                self.loop.call_soon(strike, f"right after a write to store {node_id}'s disk",
                                    context=harness)
            return written

        for node_id in struck:
            disk = self.disks[node_id]
            assert isinstance(disk, SimDisk)  # noqa: S101 - an --fsync run's disk
            disk.on_next_write = arm(node_id)
        self.loop.call_later(2.0, strike, "2 s after it was aimed", context=harness)

    def _cut_power(self, node_id: int) -> None:
        inc = self.net.current(store_name(node_id))
        disk = self.disks[node_id]
        assert isinstance(disk, SimDisk)  # noqa: S101 - an --fsync or replicated run's disk
        # The page cache dies with the machine, the process with it if it ran.
        inc.kill()
        keep = self.rng.randint(0, disk.unsynced_writes)
        lost = disk.lose_unsynced(keep)
        self._fault("power-loss", f"{inc}: {lost} unsynced writes lost, {keep} kept")
        self.loop.call_later(self.rng.randint(10, 3_000) / 1000, self._restart_store, node_id,
                             context=contextvars.Context())

    def _lose_power(self) -> None:
        node_id = self.rng.randrange(len(self.layout.stores))
        inc = self.net.current(store_name(node_id))
        disk = self.disks[node_id]
        assert isinstance(disk, SimDisk)  # noqa: S101 - a replicated run's disk
        inc.kill()
        keep = self.rng.randint(0, disk.unsynced_writes)
        lost = disk.lose_unsynced(keep)
        self._fault("power-loss", f"{inc}: {lost} writes since the last writeback lost, "
                                  f"{keep} kept")
        self.loop.call_later(self.rng.randint(10, 3_000) / 1000, self._restart_store, node_id)

    def _wipe_store(self) -> None:
        """A store's disk dies: the store comes back empty (one failure at a
        time, as for a power loss)."""
        self._when_in_sync("wipe", self._wipe)

    def _wipe(self) -> None:
        node_id = self.rng.randrange(len(self.layout.stores))
        inc = self.net.current(store_name(node_id))
        inc.kill()
        disk = self.disks[node_id]
        assert isinstance(disk, SimDisk)  # noqa: S101 - a replicated run's disk
        disk.wipe()
        self._wipe_unrecovered = True
        self._fault("wipe", f"{inc}: killed, its disk replaced by an empty one")
        self.loop.call_later(self.rng.randint(10, 5_000) / 1000, self._restart_store, node_id)

    def _when_in_sync(self, what: str, fault: Callable[[], None]) -> None:
        """Runs `fault` once every replica is in sync (one destructive fault
        at a time); gives up after IN_SYNC_WAIT_S."""
        if self._destructive_pending:
            return
        self._destructive_pending = True

        async def wait() -> None:
            try:
                deadline_s = self.loop.time() + IN_SYNC_WAIT_S
                while not self._all_in_sync():
                    if self._quiescing or self.loop.time() > deadline_s:
                        self.trace(f"{what} skipped: the replicas were not all in sync")
                        return
                    await asyncio.sleep(0.2)
                if not self._quiescing:
                    fault()
            finally:
                self._destructive_pending = False

        asyncio.ensure_future(wait())

    def _pause_leader(self) -> None:
        """A leader's process stops past its lease: its partitions move; when
        it resumes it must acknowledge nothing the new leaders lack."""
        leaders = self._leaders()
        if not leaders:
            return
        inc = self.net.current(store_name(self.rng.choice(leaders)))
        if inc.dead or inc.paused:
            return
        inc.pause()
        pause_s = LEASE_TTL_S + self.rng.randint(200, 6_000) / 1000
        self._fault("pause", f"leader {inc} for {pause_s:.1f} s (lease {LEASE_TTL_S} s)")
        self.loop.call_later(pause_s, self._resume, inc)

    def _partition_leader(self) -> None:
        """A network partition around a leader: cut off from the other
        stores only (it keeps its lease; its followers fall out of its ISR,
        and below min.insync.replicas it refuses writes), or from the
        metadata store too (its partitions get new leaders while clients
        still reach it), or from every node."""
        leaders = self._leaders()
        if not leaders:
            return
        node_id = self.rng.choice(leaders)
        name = store_name(node_id)
        kind = self.rng.choice(["stores", "stores+metadata", "everyone"])
        links = {frozenset((name, store_name(n))) for n in range(len(self.layout.stores))
                 if n != node_id}
        if kind == "everyone":
            self.net.isolated.add(name)
        else:
            self.net.cut_links |= links
        if kind != "stores":
            self._metadata_cut.add(node_id)
            self._apply_metadata_availability()
        heal_s = self.rng.randint(500, 12_000) / 1000
        self._fault("partition", f"{name} from {kind} for {heal_s:.1f} s")

        def heal() -> None:
            self.net.isolated.discard(name)
            self.net.cut_links -= links
            self._metadata_cut.discard(node_id)
            self._apply_metadata_availability()
            self.trace(f"HEAL {name}")

        self.loop.call_later(heal_s, heal)

    def _metadata_outage(self) -> None:
        """The metadata store is out of every store's reach for a while:
        leaders keep serving, and no leadership changes until it returns."""
        if not self._metadata_up:
            return
        self._metadata_up = False
        self._apply_metadata_availability()
        down_s = self.rng.randint(1_000, 10_000) / 1000
        self._fault("metadata-outage", f"for {down_s:.1f} s")
        before = self._leadership()

        def back() -> None:
            if self._metadata_up:
                return  # quiescing ended the outage already
            # No store may change whom it follows or whether it leads on
            # its own while no decision can be made. Catching up with a
            # decision made before the outage (learned from a peer that saw
            # it, when this store was cut off then) is not on its own: the
            # metadata store holds that decision, and none newer.
            after = self._leadership()
            for (inc, tp), was in sorted(before.items()):
                now = after.get((inc, tp))
                decided = self._partition_state(*tp)
                if decided is not None and now == (decided.leader, decided.leader_epoch):
                    continue
                if now is not None and now != was and self._failure is None:
                    self._failure = Violation(
                        f"{tp[0]}-{tp[1]}: store {inc} went from (leader, epoch) {was} to "
                        f"{now} while the metadata store was unreachable")
                    self.loop.stop()
            self._metadata_up = True
            self._apply_metadata_availability()
            self.trace("METADATA back")

        self.loop.call_later(down_s, back)

    def _leadership(self) -> dict[tuple[str, tuple[str, int]], tuple[int, int]]:
        """(store incarnation, partition) -> (leader, leader epoch) as each
        running store's runtime sees it."""
        seen = {}
        for node_id in range(len(self.layout.stores)):
            inc = self.net.current(store_name(node_id))
            runtime = inc.runtime
            if inc.dead or not inc.serving or not isinstance(runtime, StoreRuntime):
                continue
            for part in runtime.partitions:
                if not part.closed:
                    seen[(repr(inc), (part.topic.name, part.partition))] = (
                        part.state.leader, part.state.leader_epoch)
        return seen

    def _apply_metadata_availability(self) -> None:
        for node_id, client in self._metadata_clients.items():
            client.set_available(self._metadata_up and node_id not in self._metadata_cut)

    def _crash_store(self) -> None:
        node_id = self.rng.randrange(len(self.layout.stores))
        old = self.net.current(store_name(node_id))
        if old.dead:
            return
        old.kill()
        self._fault("crash", f"{old}")
        down_s = self.rng.randint(10, 3_000) / 1000
        self.loop.call_later(down_s, self._restart_store, node_id)

    def _crash_store_now(self, inc: Incarnation, why: str) -> None:
        """A store process dies at a moment the network chose (right after
        it answered, or as a request arrived)."""
        if inc.dead or self._quiescing:
            return
        node_id = int(inc.name.rpartition("-")[2])
        if self.fsync:
            # The machine's crash, not only the process's: what the store
            # just acknowledged must have been synced.
            self.trace(f"{inc} {why}")
            self._cut_power(node_id)
            return
        inc.kill()
        self._fault("crash", f"{inc} {why}")
        # Replicated runs schedule the restart from the harness's context:
        # from the dying process's (called right after it answered), the
        # restart dies with it and the store stays down until quiescing.
        # Single-copy runs still do that; their CI seeds and TEETH were
        # found so.
        self.loop.call_later(self.rng.randint(10, 3_000) / 1000, self._restart_store, node_id,
                             context=contextvars.Context() if self.replicated else None)

    def _restart_store(self, node_id: int) -> None:
        if self.net.current(store_name(node_id)).dead:
            self.start_store(node_id)

    def _coordinator_names(self) -> list[str]:
        """Every coordinator node, transaction and group."""
        return ([coordinator_name(n) for n in range(len(self.layout.coordinators))]
                + [group_coordinator_name(n)
                   for n in range(len(self.layout.group_coordinators))])

    def _start_node(self, name: str) -> Incarnation:
        kind, _, number = name.rpartition("-")
        if kind == "group-coordinator":
            return self.start_group_coordinator(int(number))
        if kind == "coordinator":
            return self.start_coordinator(int(number))
        return self.start_store(int(number))

    def _crash_coordinator(self) -> None:
        name = self.rng.choice(self._coordinator_names())
        old = self.net.current(name)
        if old.dead:
            return
        old.kill()
        self._fault("crash", f"{old}")
        self.loop.call_later(self.rng.randint(10, 3_000) / 1000, self._restart_node, name)

    def _restart_node(self, name: str) -> None:
        if self.net.current(name).dead:
            self._start_node(name)

    def _restart_coordinator(self, node_id: int) -> None:
        self._restart_node(coordinator_name(node_id))

    def _replace_coordinator(self, node_id: int | None = None,
                             wake_s: float | None = None, *, name: str | None = None) -> None:
        """The old process is paused, a new one takes its partitions; the old
        one resumes later (`wake_s`) as a zombie and dies some time after.
        (`node_id`: that transaction coordinator; else `name`, else any
        coordinator, transaction or group.)"""
        if node_id is not None:
            name = coordinator_name(node_id)
        elif name is None:
            name = self.rng.choice(self._coordinator_names())
        old = self.net.current(name)
        if old.dead:
            return
        old.pause()
        self._fault("takeover", f"{old} paused, replaced")
        self._start_node(name)
        if wake_s is None:
            wake_s = self.rng.randint(1_000, 30_000) / 1000
        self.loop.call_later(wake_s, self._wake_zombie, old)

    def _jump_clock(self) -> None:
        """The wall clock jumps ahead: transactions time out, idle producers
        and transactional ids expire."""
        jump_ms = self.rng.randint(20_000, 250_000)
        self.clock_offset_ms += jump_ms
        self._fault("clock-jump", f"+{jump_ms} ms")

    def _admin_abort(self) -> None:
        """An operator aborts a transactional id's open transaction
        (AbortTransaction: the hanging-transaction tool), fencing its
        producer."""
        tid = self.rng.choice(sorted({p.transactional_id for p in self.producers}))
        layout = self.layout
        name = coordinator_name(layout.coordinator_for_partition(
            layout.transaction_state_partition(tid)))
        inc = self.net.current(name)
        runtime = inc.runtime
        if inc.dead or not isinstance(runtime, TxnCoordinatorRuntime):
            return
        self._fault("admin-abort", f"{tid} at {inc}")
        inc.spawn(runtime.force_abort(tid))

    def _arm_slow_client(self) -> None:
        self._slow_client_armed = True

    async def _after_add(self, producer: TxnProducer) -> None:
        """The slow-client-zombie recipe (SLOW_CLIENT_ZOMBIE), once armed: a
        producer that has just added its partitions stalls before its first
        write, long enough for its transaction to time out and the stores to
        forget it, while its coordinator is replaced and the old process
        stays paused a little longer than the client: the client's late
        first write is then verified by a zombie that resumes with the
        question waiting (issue 3's interleaving)."""
        coordinator = self.net.current(producer.coordinator_node)
        if not self._slow_client_armed or self._quiescing or coordinator.paused \
                or coordinator.dead:
            return
        self._slow_client_armed = False
        rng = self.rng
        stall_s = rng.randint(40_000, 55_000) / 1000
        self._fault("slow-client", f"{producer} stalls {stall_s:.1f} s before its first write")
        node_id = self.layout.coordinator_for_partition(
            self.layout.transaction_state_partition(producer.transactional_id))
        self._replace_coordinator(node_id, wake_s=stall_s + rng.randint(200, 4_000) / 1000)
        await asyncio.sleep(stall_s)

    def _wake_zombie(self, zombie: Incarnation) -> None:
        if zombie.dead:
            return
        zombie.resume()
        self.trace(f"RESUME zombie {zombie}")
        self.loop.call_later(self.rng.randint(1_000, 20_000) / 1000, self._kill, zombie)

    def _kill(self, inc: Incarnation) -> None:
        if not inc.dead:
            inc.kill()
            self.trace(f"KILL {inc}")

    def _pause_node(self) -> None:
        names = sorted(self.net.nodes)
        inc = self.net.current(self.rng.choice(names))
        if inc.dead or inc.paused:
            return
        inc.pause()
        self._fault("pause", f"{inc}")
        self.loop.call_later(self.rng.randint(100, 8_000) / 1000, self._resume, inc)

    def _resume(self, inc: Incarnation) -> None:
        if inc.paused:
            inc.resume()
            self.trace(f"RESUME {inc}")

    def _stall_producer(self) -> None:
        live = [p for p in self.producers if not p.done and not p.me.paused]
        if not live:
            return
        producer = self.rng.choice(live)
        producer.me.pause()
        self._fault("stall", f"{producer}")
        self.loop.call_later(self.rng.randint(15_000, 40_000) / 1000, self._resume, producer.me)

    def _new_producer_instance(self) -> None:
        live = [p for p in self.producers if not p.done]
        if not live:
            return
        old = self.rng.choice(live)
        instance = 1 + max(p.instance for p in self.producers
                           if p.transactional_id == old.transactional_id)
        self._fault("reinit", f"{old.transactional_id} instance {instance}")
        if self.rng.random() < 0.5:
            old.me.kill()  # the old instance crashed
        self._start_instance(old.transactional_id, instance)

    # ------------------------------------------------------------ the run

    def _on_step(self) -> None:
        if self._failure is not None:
            return
        if self.loop.steps % self.check_every_steps == 0:
            try:
                complete = self.txn_log.refresh()
                self.checker.check_step(log_complete=complete)
                self.output_checker.check_step(log_complete=complete)
                self.group_checker.check_step()
                if self.replicated:
                    self.replica_checker.check_step()
            except Violation as exc:
                self._failure = exc
                self.loop.stop()
        if self.loop.steps % 1_000 == 0:
            self.loop.forget_done_tasks()

    async def setup(self) -> None:
        """Starts the stores, creates the data topic, starts the coordinators."""
        for node_id in range(len(self.layout.stores)):
            self.start_store(node_id)
        # Any store creates topics on a replicated cluster; node 0 owns the
        # catalog otherwise.
        creator = self.net.current(store_name(self.layout.controller_node_id))
        while not creator.serving:
            await asyncio.sleep(0.01)
        if self.replicated or self.fsync:
            self._start_timers()
        outcomes = await self._as_store(creator.runtime, creator.runtime.create_topics(
            [TopicSpec(DATA_TOPIC, self.data_partitions),
             TopicSpec(INPUT_TOPIC, self.input_partitions),
             TopicSpec(OUTPUT_TOPIC, self.input_partitions)], validate_only=False))
        if any(o.error is not None for o in outcomes):
            raise RuntimeError(f"harness: topics not created: {outcomes}")
        if self.replicated:
            await self._until(self._all_in_sync, "every partition in sync")
        if self.copiers:
            await self._write_input()
        if self.near_exhaustion:
            await self._near_epoch_exhaustion("txn-0")
        for node_id in range(len(self.layout.coordinators)):
            self.start_coordinator(node_id)
        for node_id in range(len(self.layout.group_coordinators)):
            self.start_group_coordinator(node_id)

    async def _until(self, predicate: Callable[[], bool], what: str,
                     limit_s: float = 60.0) -> None:
        deadline_s = self.loop.time() + limit_s
        while not predicate():
            if self.loop.time() > deadline_s:
                raise RuntimeError(f"harness: no {what} after {limit_s:.0f} s")
            await asyncio.sleep(0.05)

    async def _near_epoch_exhaustion(self, transactional_id: str) -> None:
        """A transactional id whose epoch is three bumps from int16's end (a
        long life of transactions), written to the transaction log before
        any coordinator loads it: its bumps soon rotate the producer id."""
        md = txn.TxnMetadata(
            transactional_id=transactional_id, producer_id=EXHAUSTED_PRODUCER_ID,
            producer_epoch=txn.MAX_PRODUCER_EPOCH - 2, previous_producer_id=txn.NO_PRODUCER_ID,
            previous_producer_epoch=-1, transaction_timeout_ms=20_000,
            state=txn.TxnState.COMPLETE_COMMIT, last_update_ms=0, bump_reason="init")
        partition = self.layout.transaction_state_partition(transactional_id)
        store = await self._started_store(TRANSACTION_STATE_TOPIC, partition)
        batch = records.encode_batch([(*encode_txn(md), None, 0)])
        (outcome,) = await self._as_store(store, store.produce(
            [ProduceItem(TRANSACTION_STATE_TOPIC, partition, batch, 0)], timeout_ms=10_000,
            coordinator_write=True))
        if outcome.error is not None:
            raise RuntimeError(f"harness: {transactional_id}'s record not written: {outcome}")
        self.trace(f"{transactional_id} starts at producer {EXHAUSTED_PRODUCER_ID} epoch "
                   f"{md.producer_epoch}")

    async def _as_store(self, runtime: StoreRuntime, call: Coroutine[Any, Any, T]) -> T:
        """Runs a call of the harness on a store as a task of the store's
        process (what it starts, a replicated store's followers among them,
        is the process's and dies with it). Single-copy runs call it from the
        harness, as they always have (their seeds were found so)."""
        if not self.replicated:
            return await call
        for incarnations in self.net.nodes.values():
            for inc in incarnations:
                if inc.runtime is runtime:
                    return await inc.spawn(call)
        raise RuntimeError("harness: a store runtime of no process")

    async def _started_store(self, topic: str, partition: int) -> StoreRuntime:
        while True:
            store = self._store_for(topic, partition)
            if store is not None and store.started:
                return store
            await asyncio.sleep(0.01)

    async def _write_input(self) -> None:
        """The copiers' input, written before anything else runs (a plain
        producer, straight to each store: no fault can touch it)."""
        for partition, count in enumerate(self.input_records):
            store = await self._started_store(INPUT_TOPIC, partition)
            batch = records.encode_batch([(None, input_value(partition, i), None, 0)
                                          for i in range(count)])
            (outcome,) = await self._as_store(store, store.produce(
                [ProduceItem(INPUT_TOPIC, partition, batch)], timeout_ms=10_000))
            if outcome.error is not None or outcome.base_offset != 0:
                raise RuntimeError(f"harness: input of {INPUT_TOPIC}-{partition} not written: "
                                   f"{outcome}")

    async def _main(self) -> None:
        self.trace(f"transaction version 1: {sorted(self.version_1_ids) or 'none'}")
        if self.membership:
            self.trace(f"copiers are members of group {GROUP_ID!r}")
        await self.setup()
        for index in range(self.rng.randint(2, 4)):
            self.start_producer(f"txn-{index}", 0)
        for index in range(self.copiers):
            self.start_copier(index, 0)
        self._pick_faults()
        faults = asyncio.ensure_future(self._faults()) if self.with_faults else None
        while self.loop.steps < self.steps:
            await asyncio.sleep(0.05)
        await self.quiesce(faults)
        # Inside the loop: the checker reads through the stores' fetch.
        self.check_final()

    def check_final(self) -> None:
        if not self.txn_log.refresh():
            raise Violation("the transaction log is not readable after quiescing")
        errors = self.net.handler_errors + self.loop.errors
        self.checker.check_final(runtime_errors=errors)
        self.output_checker.check_final(runtime_errors=errors)
        self.group_checker.check_final()
        if self.replicated:
            self.replica_checker.check_final()

    async def quiesce(self, faults: asyncio.Future[None] | None = None) -> None:
        self.trace("QUIESCE")
        self._quiescing = True
        if faults is not None:
            faults.cancel()
        self.net.faults = FaultProfile(zombie_route=0.0)
        self.net.route_to.clear()
        self.net.cut_links.clear()
        self.net.isolated.clear()
        self._metadata_up = True
        self._metadata_cut.clear()
        self._apply_metadata_availability()
        for rule in list(self.net.holds):
            self.net.release(rule)
        for name, incarnations in sorted(self.net.nodes.items()):
            for inc in incarnations[:-1]:
                if not inc.dead and not name.startswith("producer"):
                    inc.kill()  # zombies die
            current = incarnations[-1]
            current.resume()
        for node_id in range(len(self.layout.stores)):
            self._restart_store(node_id)
        for name in self._coordinator_names():
            self._restart_node(name)
        for producer in list(self.producers):
            producer.stop_requested = True
            producer.me.resume()
        deadline_s = self.loop.time() + QUIESCE_LIMIT_S
        while any(not p.done and not p.me.dead for p in self.producers) or any(
                not self._copier_finished(i) for i in range(self.copiers)) or any(
                self.handoff.pending(tid) for tid in self.two_phase_ids):
            if self.loop.time() > deadline_s:
                stuck = [repr(p) for p in self.producers if not p.done and not p.me.dead]
                raise Violation(f"producers did not finish while quiescing: {stuck}")
            self._restart_fenced()
            # With no instance running, a copier that has input left and a
            # two-phase-commit id with a prepared state handed over get a
            # new one (to copy the rest; to complete it).
            for tid in sorted({p.transactional_id for p in self.producers}):
                instances = [p for p in self.producers if p.transactional_id == tid]
                if (tid.startswith("copier-") and not self._copier_finished(
                        int(tid.split("-")[1]))) or self.handoff.pending(tid) is not None:
                    self._replace_ended(instances[-1])
            await asyncio.sleep(1.0)
        # Long enough for transaction timeouts (abandoned transactions of
        # killed producers) and their markers.
        await asyncio.sleep(TxnConfig().check_interval_ms / 1000 + 60.0)
        if self.replicated:
            # Every replica back in sync, at its leader's end (the checker
            # says what is missing when it is not).
            deadline_s = self.loop.time() + self.converge_limit_s
            while not self._converged() and self.loop.time() < deadline_s:
                await asyncio.sleep(0.5)

    def _restart_fenced(self) -> None:
        """A supervisor's part: a coordinator process that another one (a
        zombie that finished loading after it) fenced off a partition owns
        it no more, and nobody serves the partition once the zombie is gone;
        it is restarted, and the new process claims the partition."""
        for name in self._coordinator_names():
            current = self.net.current(name)
            runtime = current.runtime
            partitions = getattr(runtime, "partitions", {})
            if not current.dead and any(o.fenced for o in partitions.values()):
                current.kill()
                self.trace(f"RESTART {current}: fenced")
                self._start_node(name)

    def _input_copied(self) -> bool:
        """The group's durable committed offsets are the input's ends (the
        harness tells member copiers told to stop that they may leave)."""
        committed = self.group_checker.committed_offsets()
        return committed is not None and all(
            committed.get(p) is not None and committed[p].offset == count
            for p, count in enumerate(self.input_records))

    def _copier_finished(self, index: int) -> bool:
        """An instance of copier `index` stopped after copying all its input."""
        tid = f"copier-{index}"
        return any(isinstance(p, Copier) and p.done and p.drained()
                   for p in self.producers if p.transactional_id == tid)

    def run(self, main: Callable[[], Coroutine[Any, Any, None]] | None = None) -> SimResult:
        """Runs `_main` (or `main`: a scripted schedule) to its end and judges it."""
        started_s = time.perf_counter()
        self.loop.on_step = self._on_step
        failure = ""
        try:
            self.loop.run_until_complete((main or self._main)())
        except Violation as exc:
            failure = str(exc)
        except RuntimeError as exc:
            if self._failure is None and not isinstance(exc, SimulationStuck):
                # loop.stop() from the checker ends run_until_complete so.
                failure = f"{type(exc).__name__}: {exc}"
            elif isinstance(exc, SimulationStuck):
                failure = f"liveness: {exc}"
        except BaseException:
            # A scripted schedule's own assertion (or a bug of the harness):
            # not the checker's verdict, so it propagates.
            self._close()
            raise
        if self._failure is not None:
            failure = str(self._failure)
        result = SimResult(
            seed=self.seed, steps_asked=self.steps, steps=self.loop.steps, ok=not failure,
            failure=failure,
            trace_tail="\n".join(self.trace_lines), simulated_s=self.loop.time(),
            wall_s=time.perf_counter() - started_s, messages=self.net.messages,
            committed=self.counters.committed, aborted=self.counters.aborted,
            fenced=self.counters.fenced, checks=self.checker.checks,
            faults=dict(self.fault_counts),
            disk_syncs=sum(d.syncs for d in self.disks if isinstance(d, SimDisk)),
            joins=self.counters.joins, member_refusals=self.counters.member_refusals,
        )
        self._close()
        return result

    def _close(self) -> None:
        """Leaves nothing behind: the loop is closed with its tasks abandoned."""
        # Close every unfinished coroutine now, while the loop is open, so
        # their finally clauses do not run later at garbage collection
        # against a closed loop (or during the next seed).
        for task in [*asyncio.all_tasks(self.loop), *self.loop.graveyard]:
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            with contextlib.suppress(BaseException):
                task.get_coro().close()
        self.loop.graveyard.clear()
        self.loop.close()


def default_steps(*, replicated: bool = False) -> int:
    return DEFAULT_REPLICATED_STEPS if replicated else DEFAULT_STEPS


def run_seed(seed: int, *, steps: int | None = None, bug: str | None = None,
             verbose: bool = False, faults: bool = True, replicated: bool = False,
             fsync: bool = False) -> SimResult:
    """Runs one seed (with a deliberately broken runtime when `bug` names one
    of BUGS; on replicated stores with `replicated`; with `fsync`, stores
    that sync before acknowledging and machine crashes at any moment)."""
    guard = broken(bug)
    # The runtimes log every retry and failover; the trace says what matters.
    logging.disable(logging.NOTSET if verbose else logging.CRITICAL)
    try:
        with guard:
            return Simulation(seed, steps=steps, verbose=verbose, faults=faults,
                              replicated=replicated, fsync=fsync).run()
    finally:
        logging.disable(logging.NOTSET)


def replay_command(seed: int, *, steps: int | None = None, bug: str | None = None,
                   replicated: bool = False, fsync: bool = False) -> str:
    extra = "" if steps in (None, default_steps(replicated=replicated)) else f" --steps {steps}"
    extra += " --replicated" if replicated else ""
    extra += " --fsync" if fsync else ""
    extra += f" --bug {bug}" if bug else ""
    return f".venv/bin/python -m tests.sim.real --seed {seed}{extra}"


__all__ = ["BUGS", "DATA_TOPIC", "DEFAULT_REPLICATED_STEPS", "DEFAULT_STEPS", "FSYNC_BUGS",
           "RECIPE_SHARE",
           "REPLICATED_STORES", "REPLICATION_BUGS", "SLOW_CLIENT_ZOMBIE", "DeterministicLoop",
           "SimResult", "Simulation", "broken", "default_steps", "replay_command", "run_seed"]
