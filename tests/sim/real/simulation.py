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
   `__consumer_offsets` within each transaction. A producer instance that
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

`bug` (tests only) runs with one deliberately broken piece, to show that the
checker catches it (see BUGS).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from oncelog import records
from oncelog.errors import ErrorCode, OncelogError
from services.common.cluster import TRANSACTION_STATE_TOPIC, ClusterLayout
from services.common.errors import ServiceError
from services.coordinator.core import transactions as txn
from services.coordinator.core.producer_ids import DEFAULT_BLOCK_SIZE
from services.coordinator.core.txn_log import encode_txn
from services.coordinator.runtime import ProducerIdManager
from services.coordinator.txn_runtime import TxnConfig, TxnCoordinatorRuntime
from services.group_coordinator.core import offsets_log
from services.group_coordinator.runtime import GroupConfig, GroupCoordinatorRuntime
from services.partition_store import partition as partition_module
from services.partition_store.core import producer_state
from services.partition_store.core.outcomes import Rejection
from services.partition_store.runtime import ProduceItem, StoreConfig, StoreRuntime, TopicSpec
from services.partition_store.storage.memory import MemoryStore
from tests.sim.real.checker import (
    Checker,
    GroupChecker,
    Ledger,
    TxnLogView,
    Violation,
    input_value,
)
from tests.sim.real.loop import DeterministicLoop, SimulationStuck, new_loop
from tests.sim.real.network import (
    FaultProfile,
    Incarnation,
    Network,
    RpcTimeout,
    RpcUnavailable,
    SimControllerLink,
    SimMarkerSender,
    SimProducerIdLog,
    SimStoreClient,
    SimTxnLog,
    SimTxnVerifier,
    coordinator_name,
    group_coordinator_name,
    store_name,
)
from tests.sim.real.workload import Copier, Counters, Handoff, ProducerDone, TxnProducer

DATA_TOPIC = "data"
# The read-process-write workload: copiers read INPUT_TOPIC (written once,
# at setup, by a plain producer) and write OUTPUT_TOPIC, committing their
# input offsets in group GROUP_ID within the same transactions.
INPUT_TOPIC = "input"
OUTPUT_TOPIC = "output"
GROUP_ID = "copiers"
DEFAULT_STEPS = 5_000
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
# A producer id no block of the coordinators' hands out: the transactional id
# whose epoch starts near int16's end (`_near_epoch_exhaustion`).
EXHAUSTED_PRODUCER_ID = 1 << 40


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
    original = StoreRuntime._await_durable

    async def skip(self: StoreRuntime, waits: Any, timeout_ms: int) -> dict[int, Any]:
        del self, waits, timeout_ms
        return {}

    StoreRuntime._await_durable = skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        StoreRuntime._await_durable = original  # type: ignore[method-assign]


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
    return _patched(partition_module, "select_batches", leaky)


def _skip_verification() -> contextlib.AbstractContextManager[None]:
    """A store that skips the coordinator's verification of a producer's
    first transactional write to a partition: a write to a partition the
    transaction never added opens a transaction no marker will end."""
    def unverified(original: Callable[..., Any]) -> Callable[..., Any]:
        def check(entry: Any, header: Any, *, topic_partition: str,
                  txn_verified: bool = False) -> Any:
            del txn_verified
            return original(entry, header, topic_partition=topic_partition, txn_verified=True)
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


# Deliberately broken runtimes for the "checker has teeth" tests.
BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "no-confirm-ownership": _no_confirm_ownership,
    "ack-before-durable": _ack_before_durable,
    "no-marker-epoch-check": _no_marker_epoch_check,
    "offsets-on-abort": _offsets_on_abort,
    "leaky-read-committed": _leaky_read_committed,
    "skip-verification": _skip_verification,
    "two-phase-timeout": _two_phase_timeout,
    "complete-any-state": _complete_any_state,
}


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

    def summary(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.faults.items()))
        return (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} {self.steps} steps, "
                f"{self.simulated_s:.0f} s simulated in {self.wall_s:.2f} s, "
                f"{self.messages} messages, {self.committed} committed, {self.aborted} "
                f"aborted, {self.fenced} producers ended, faults: {faults or 'none'}")


class Simulation:
    def __init__(self, seed: int, *, steps: int = DEFAULT_STEPS, check_every_steps: int = 25,
                 faults: bool = True, verbose: bool = False, fifo: bool = False,
                 layout: ClusterLayout | None = None, data_partitions: int | None = None,
                 copiers: int | None = None) -> None:
        self.seed = seed
        # A fault recipe: a pattern of faults aimed at one kind of bug, for a
        # share of the seeds (drawn apart from the run's generator, so the
        # other seeds run as they did before recipes existed). A recipe seed
        # runs the plain workload only (no copiers, no two-phase commit, no
        # clock jumps or admin aborts), which would end its pattern early.
        self.recipe = (SLOW_CLIENT_ZOMBIE if faults
                       and random.Random(f"recipe {seed}").random() < RECIPE_SHARE else None)
        self.steps = steps
        self.check_every_steps = check_every_steps
        self.with_faults = faults
        self.verbose = verbose
        self.loop, self.rng = new_loop(seed, fifo=fifo)
        self.trace_lines: deque[str] = deque(maxlen=TRACE_TAIL_LINES)
        self.net = Network(self.loop, self.rng, self.trace)
        self.loop.expected_errors += (ServiceError, OncelogError, RpcTimeout, RpcUnavailable,
                                      ProducerDone)
        rng = self.rng
        self.layout = layout or ClusterLayout(
            stores=tuple(f"store-{i}:0" for i in range(rng.randint(2, 3))),
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
        self.disks = [MemoryStore() for _ in self.layout.stores]
        self.ledger = Ledger()
        self.counters = Counters()
        self.txn_log = TxnLogView(self.layout.transaction_state_partitions, self._store_for)
        self.checker = Checker(self.ledger, DATA_TOPIC, self.data_partitions, self._store_of,
                               self.txn_log)
        self.output_checker = Checker(self.ledger, OUTPUT_TOPIC, self.input_partitions,
                                      lambda p: self._store_for(OUTPUT_TOPIC, p), self.txn_log)
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
        """The live store runtime holding the partition, once it knows it."""
        node = self.net.current(store_name(self.layout.store_for(topic, partition)))
        runtime = node.runtime
        if node.dead or not isinstance(runtime, StoreRuntime):
            return None
        try:
            runtime.partition(topic, partition)  # known to this store yet?
        except Exception:
            return None
        return runtime

    def _group_coordinator_of(self, node_id: int) -> GroupCoordinatorRuntime | None:
        node = self.net.current(group_coordinator_name(node_id))
        runtime = node.runtime
        if node.dead or node.paused or not isinstance(runtime, GroupCoordinatorRuntime):
            return None
        return runtime

    def start_store(self, node_id: int) -> Incarnation:
        inc = self._new_incarnation(store_name(node_id))
        config = StoreConfig(
            node_id=node_id, layout=self.layout, snapshot_interval_batches=20,
            snapshot_interval_ms=5_000, retention_check_interval_ms=3_000,
            producer_id_expiration_ms=15_000, catalog_refresh_interval_ms=2_000,
        )
        runtime = StoreRuntime(
            self.disks[node_id], config,
            controller=None if config.is_controller else SimControllerLink(
                self.net, inc, self.layout),
            txn_verifier=SimTxnVerifier(self.net, inc, self.layout),
            clock_ms=self.clock_ms,
        )
        inc.runtime = runtime
        self.net.add(inc)
        inc.spawn(runtime.start())
        self.trace(f"start {inc}")
        return inc

    def start_coordinator(self, node_id: int) -> Incarnation:
        inc = self._new_incarnation(coordinator_name(node_id))
        client = SimStoreClient(self.net, inc, self.layout)
        runtime = TxnCoordinatorRuntime(
            layout=self.layout, node_id=node_id,
            txn_log=SimTxnLog(client, self.clock_ms),
            markers=SimMarkerSender(self.net, inc, self.layout),
            producer_ids=ProducerIdManager(SimProducerIdLog(client, self.clock_ms),
                                           node_id=node_id, block_size=DEFAULT_BLOCK_SIZE),
            now_ms=self.clock_ms,
            config=TxnConfig(max_transaction_timeout_ms=60_000, check_interval_ms=1_000,
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
            store=SimStoreClient(self.net, inc, self.layout), now_ms=self.clock_ms,
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
            txn_open=self._txn_open,
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
        self.net.faults = FaultProfile(
            drop=rng.choice([0.0, 0.01, 0.03, 0.08]),
            duplicate=rng.choice([0.0, 0.01, 0.05]),
            slow=rng.choice([0.0, 0.01, 0.05]),
            zombie_route=rng.choice([0.2, 0.5]),
            crash_after_reply=rng.choice([0.0, 0.002, 0.005]),
            crash_on_request=rng.choice([0.0, 0.002, 0.005]),
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
        while not self._quiescing:
            await asyncio.sleep(rng.randint(2_000, 15_000) / 1000)
            if self._quiescing:
                return
            rng.choice(actions)()

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
        inc.kill()
        self._fault("crash", f"{inc} {why}")
        node_id = int(inc.name.rpartition("-")[2])
        self.loop.call_later(self.rng.randint(10, 3_000) / 1000, self._restart_store, node_id)

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
            except Violation as exc:
                self._failure = exc
                self.loop.stop()
        if self.loop.steps % 1_000 == 0:
            self.loop.forget_done_tasks()

    async def setup(self) -> None:
        """Starts the stores, creates the data topic, starts the coordinators."""
        for node_id in range(len(self.layout.stores)):
            self.start_store(node_id)
        controller = self.net.current(store_name(self.layout.controller_node_id)).runtime
        while not controller.started:
            await asyncio.sleep(0.01)
        await controller.create_topics([TopicSpec(DATA_TOPIC, self.data_partitions),
                                        TopicSpec(INPUT_TOPIC, self.input_partitions),
                                        TopicSpec(OUTPUT_TOPIC, self.input_partitions)],
                                       validate_only=False)
        if self.copiers:
            await self._write_input()
        if self.near_exhaustion:
            await self._near_epoch_exhaustion("txn-0")
        for node_id in range(len(self.layout.coordinators)):
            self.start_coordinator(node_id)
        for node_id in range(len(self.layout.group_coordinators)):
            self.start_group_coordinator(node_id)

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
        (outcome,) = await store.produce(
            [ProduceItem(TRANSACTION_STATE_TOPIC, partition, batch, 0)], timeout_ms=10_000,
            coordinator_write=True)
        if outcome.error is not None:
            raise RuntimeError(f"harness: {transactional_id}'s record not written: {outcome}")
        self.trace(f"{transactional_id} starts at producer {EXHAUSTED_PRODUCER_ID} epoch "
                   f"{md.producer_epoch}")

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
            (outcome,) = await store.produce([ProduceItem(INPUT_TOPIC, partition, batch)],
                                             timeout_ms=10_000)
            if outcome.error is not None or outcome.base_offset != 0:
                raise RuntimeError(f"harness: input of {INPUT_TOPIC}-{partition} not written: "
                                   f"{outcome}")

    async def _main(self) -> None:
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

    async def quiesce(self, faults: asyncio.Future[None] | None = None) -> None:
        self.trace("QUIESCE")
        self._quiescing = True
        if faults is not None:
            faults.cancel()
        self.net.faults = FaultProfile(zombie_route=0.0)
        self.net.route_to.clear()
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


def run_seed(seed: int, *, steps: int = DEFAULT_STEPS, bug: str | None = None,
             verbose: bool = False, faults: bool = True) -> SimResult:
    """Runs one seed (with a deliberately broken runtime when `bug` names one
    of BUGS)."""
    guard = broken(bug)
    # The runtimes log every retry and failover; the trace says what matters.
    logging.disable(logging.NOTSET if verbose else logging.CRITICAL)
    try:
        with guard:
            return Simulation(seed, steps=steps, verbose=verbose, faults=faults).run()
    finally:
        logging.disable(logging.NOTSET)


def replay_command(seed: int, *, steps: int = DEFAULT_STEPS, bug: str | None = None) -> str:
    extra = "" if steps == DEFAULT_STEPS else f" --steps {steps}"
    extra += f" --bug {bug}" if bug else ""
    return f".venv/bin/python -m tests.sim.real --seed {seed}{extra}"


__all__ = ["BUGS", "DATA_TOPIC", "DEFAULT_STEPS", "RECIPE_SHARE", "SLOW_CLIENT_ZOMBIE",
           "DeterministicLoop", "SimResult", "Simulation", "broken", "replay_command",
           "run_seed"]
