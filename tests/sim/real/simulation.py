"""One seeded run of the production runtimes: setup, faults, quiesce, check.

Goal: FoundationDB's simulator / TigerBeetle's VOPR for oncelog. The real
`StoreRuntime`s and `TxnCoordinatorRuntime`s, unchanged, run on the
deterministic loop (loop.py), talk through the simulated network (network.py)
and are driven by the SDK's own producer logic (workload.py); one seed
decides every delay, loss, crash and interleaving, and an independent checker
(checker.py) judges the outcome.

Method, per seed:

1. **Setup.** A layout of 2-3 stores and 1-2 transaction coordinators (the
   `__transaction_state` partitions spread over them by
   `ClusterLayout.coordinator_for_partition`, the data topic's partitions and
   the internal topics over the stores by `store_for`). Store 0 keeps the
   catalog; the data topic is created through it before anything else.
2. **Run** for `steps` loop iterations: producers of 2-4 transactional ids
   run transactions while a fault task, at seeded intervals, crashes and
   restarts stores (recovery from the MemoryStore: snapshots + replay),
   replaces a coordinator while the old process is paused (it later resumes
   as a zombie, a share of requests still reaching it, and eventually dies),
   pauses any node for a while, stalls a producer past its transaction
   timeout, and starts a new instance of a transactional id (fencing the
   old one, which may keep running as a zombie). The network drops,
   duplicates and delays messages with per-seed odds. A share of the seeds
   also run a fault recipe that lines faults up in time for one kind of
   bug (`SLOW_CLIENT_ZOMBIE`, see `_after_add`).
3. **Quiesce**: faults off, a perfect network, every node up and every
   zombie dead, producers told to stop after their current transaction;
   then simulated time runs on until every producer has finished and the
   coordinators' timers have ended what was left open.
4. **Check**: the checker after every `check_every_steps` iterations and at
   the end (checker.py says what).

`bug` (tests only) runs with one deliberately broken piece, to show that the
checker catches it (see BUGS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from oncelog.errors import ErrorCode, OncelogError
from services.common.cluster import ClusterLayout
from services.common.errors import ServiceError
from services.coordinator.core.producer_ids import DEFAULT_BLOCK_SIZE
from services.coordinator.runtime import ProducerIdManager
from services.coordinator.txn_runtime import TxnConfig, TxnCoordinatorRuntime
from services.partition_store.core import producer_state
from services.partition_store.core.outcomes import Rejection
from services.partition_store.runtime import StoreConfig, StoreRuntime, TopicSpec
from services.partition_store.storage.memory import MemoryStore
from tests.sim.real.checker import Checker, Ledger, Violation
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
    store_name,
)
from tests.sim.real.workload import Counters, ProducerDone, TxnProducer

DATA_TOPIC = "data"
DEFAULT_STEPS = 5_000
# How long quiescing may take in simulated time before the run counts as
# not settling (a liveness failure): long enough for every timeout to fire.
QUIESCE_LIMIT_S = 600.0
TRACE_TAIL_LINES = 60
# Fault recipes (see Simulation._after_add): the share of seeds that run one.
SLOW_CLIENT_ZOMBIE = "slow-client-zombie"
RECIPE_SHARE = 0.25


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


# Deliberately broken runtimes for the "checker has teeth" tests.
BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "no-confirm-ownership": _no_confirm_ownership,
    "ack-before-durable": _ack_before_durable,
    "no-marker-epoch-check": _no_marker_epoch_check,
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
                 layout: ClusterLayout | None = None, data_partitions: int | None = None) -> None:
        self.seed = seed
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
        self.disks = [MemoryStore() for _ in self.layout.stores]
        self.ledger = Ledger()
        self.counters = Counters()
        self.checker = Checker(self.ledger, DATA_TOPIC, self.data_partitions, self._store_of)
        self.producers: list[TxnProducer] = []
        self.fault_counts: dict[str, int] = {}
        self._incarnations = 0
        # A fault recipe: a pattern of faults aimed at one kind of bug, for a
        # share of the seeds (drawn apart from the run's generator, so the
        # other seeds run as they did before recipes existed).
        self.recipe = (SLOW_CLIENT_ZOMBIE if faults
                       and random.Random(f"recipe {seed}").random() < RECIPE_SHARE else None)
        # Armed from the start: the recipe needs about a minute, and a run
        # quiesces after a minute or two.
        self._slow_client_armed = self.recipe == SLOW_CLIENT_ZOMBIE
        self._quiescing = False
        self._failure: Violation | None = None

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
        node = self.net.current(store_name(self.layout.store_for(DATA_TOPIC, partition)))
        runtime = node.runtime
        if node.dead or not isinstance(runtime, StoreRuntime):
            return None
        try:
            runtime.partition(DATA_TOPIC, partition)  # known to this store yet?
        except Exception:
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
            clock_ms=self.loop.now_ms,
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
            txn_log=SimTxnLog(client, self.loop.now_ms),
            markers=SimMarkerSender(self.net, inc, self.layout),
            producer_ids=ProducerIdManager(SimProducerIdLog(client, self.loop.now_ms),
                                           node_id=node_id, block_size=DEFAULT_BLOCK_SIZE),
            now_ms=self.loop.now_ms,
            config=TxnConfig(max_transaction_timeout_ms=60_000, check_interval_ms=1_000,
                             transactional_id_expiration_ms=3_600_000,
                             allow_two_phase_commit=False),
        )
        inc.runtime = runtime
        self.net.add(inc)
        inc.spawn(runtime.start())
        self.trace(f"start {inc}")
        return inc

    def start_producer(self, transactional_id: str, instance: int, *,
                       run: bool = True) -> TxnProducer:
        """A producer instance of the transactional id; `run`: it runs
        transactions by itself (else a script drives it, step by step, from
        tasks of its own incarnation: `producer.me.spawn(...)`)."""
        inc = self._new_incarnation(f"producer-{transactional_id}")
        self.net.add(inc)
        producer = TxnProducer(
            me=inc, net=self.net, loop=self.loop, rng=self.rng, layout=self.layout,
            ledger=self.ledger, transactional_id=transactional_id, instance=instance,
            topic=DATA_TOPIC, partitions=self.data_partitions, counters=self.counters,
            trace=self.trace, after_add=self._after_add,
        )
        inc.runtime = producer
        self.producers.append(producer)
        if run:
            inc.spawn(producer.run(max_txns=1_000))
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
        )
        if self.recipe == SLOW_CLIENT_ZOMBIE:
            self.net.faults.zombie_route = rng.choice([0.5, 0.9])
        self.trace(f"faults {self.net.faults} recipe {self.recipe}")

    async def _faults(self) -> None:
        rng = self.rng
        actions: list[Callable[[], None]] = [
            self._crash_store, self._replace_coordinator, self._pause_node,
            self._stall_producer, self._new_producer_instance, self._crash_coordinator,
        ]
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

    def _restart_store(self, node_id: int) -> None:
        if self.net.current(store_name(node_id)).dead:
            self.start_store(node_id)

    def _crash_coordinator(self) -> None:
        node_id = self.rng.randrange(len(self.layout.coordinators))
        old = self.net.current(coordinator_name(node_id))
        if old.dead:
            return
        old.kill()
        self._fault("crash", f"{old}")
        self.loop.call_later(self.rng.randint(10, 3_000) / 1000, self._restart_coordinator,
                             node_id)

    def _restart_coordinator(self, node_id: int) -> None:
        if self.net.current(coordinator_name(node_id)).dead:
            self.start_coordinator(node_id)

    def _replace_coordinator(self, node_id: int | None = None,
                             wake_s: float | None = None) -> None:
        """The old process is paused, a new one takes its partitions; the old
        one resumes later (`wake_s`) as a zombie and dies some time after."""
        if node_id is None:
            node_id = self.rng.randrange(len(self.layout.coordinators))
        old = self.net.current(coordinator_name(node_id))
        if old.dead:
            return
        old.pause()
        self._fault("takeover", f"{old} paused, replaced")
        self.start_coordinator(node_id)
        if wake_s is None:
            wake_s = self.rng.randint(1_000, 30_000) / 1000
        self.loop.call_later(wake_s, self._wake_zombie, old)

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
        self.start_producer(old.transactional_id, instance)

    # ------------------------------------------------------------ the run

    def _on_step(self) -> None:
        if self._failure is not None:
            return
        if self.loop.steps % self.check_every_steps == 0:
            try:
                self.checker.check_step()
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
        await controller.create_topics([TopicSpec(DATA_TOPIC, self.data_partitions)],
                                       validate_only=False)
        for node_id in range(len(self.layout.coordinators)):
            self.start_coordinator(node_id)

    async def _main(self) -> None:
        await self.setup()
        for index in range(self.rng.randint(2, 4)):
            self.start_producer(f"txn-{index}", 0)
        self._pick_faults()
        faults = asyncio.ensure_future(self._faults()) if self.with_faults else None
        while self.loop.steps < self.steps:
            await asyncio.sleep(0.05)
        await self.quiesce(faults)
        # Inside the loop: the checker reads through the stores' fetch.
        self.checker.check_final(runtime_errors=self.net.handler_errors + self.loop.errors)

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
        for node_id in range(len(self.layout.coordinators)):
            self._restart_coordinator(node_id)
        for producer in self.producers:
            producer.stop_requested = True
            producer.me.resume()
        deadline_s = self.loop.time() + QUIESCE_LIMIT_S
        while any(not p.done and not p.me.dead for p in self.producers):
            if self.loop.time() > deadline_s:
                stuck = [repr(p) for p in self.producers if not p.done and not p.me.dead]
                raise Violation(f"producers did not finish while quiescing: {stuck}")
            await asyncio.sleep(1.0)
        # Long enough for transaction timeouts (abandoned transactions of
        # killed producers) and their markers.
        await asyncio.sleep(TxnConfig().check_interval_ms / 1000 + 60.0)

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
