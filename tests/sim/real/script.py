"""Scripted schedules: a known interleaving, driven by hand through the simulator.

Goal: pin the interleaving of a past bug as a test that runs the same
production runtimes, network, disks and checker as the seeded search
(simulation.py), so that it keeps meaning the same thing as the code
changes: no copy of a runtime's request handling, no mocks.

Method: a `Scenario` is a `Simulation` with a fixed layout and no random
faults; the test's `script` coroutine runs in place of the random workload
and says what happens, in order, with a small vocabulary:

* **time**: `await sc.sleep(s)` (simulated; timers fire meanwhile),
  `await sc.until(predicate)`;
* **messages**: `sc.hold(*parts)` holds back the next message whose
  description contains every part (`sc.release(rule)` delivers it later),
  `sc.drop(*parts)` loses it, `sc.route(name, incarnation)` sends every
  request for a node to one incarnation (a zombie);
* **nodes**: `sc.pause`, `sc.resume`, `sc.crash`, `sc.restart_store`,
  `sc.replace_coordinator` (the old process paused, a new one loads);
  `Scenario(replicated=True)` runs three replicated stores, and
  `sc.store_node` names a partition's leader of the moment;
* **clients**: `sc.producer(tid)` is a producer of the workload (the SDK's
  sans-I/O pieces) that does nothing by itself, `sc.copier()` a copier of
  the read-process-write workload (with `Scenario(copiers=1)`); `await
  sc.do(producer, producer.write(...))` runs one of its steps as a task of
  its process.

Everything else (the order of callbacks that are ready together, message
delays) still comes from the seed, so a schedule can be run under several
seeds: what it pins must not depend on the rest. At the end the run
quiesces and the checker judges it as it judges a seed: `run` returns the
`SimResult`, and the checker has run after every loop iteration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from services.common.metadata.cluster import ClusterLayout
from services.coordinator.txn_runtime import TxnCoordinatorRuntime
from services.partition_store.runtime import StoreRuntime
from tests.sim.real.network import Hold, Incarnation, coordinator_name, store_name
from tests.sim.real.simulation import (
    CONVERGE_LIMIT_S,
    DATA_TOPIC,
    REPLICATED_STORES,
    SimResult,
    Simulation,
)
from tests.sim.real.workload import Copier, TxnProducer

T = TypeVar("T")


class ScheduleStuck(AssertionError):
    """A scripted schedule waited for something that did not happen."""


class Scenario:
    def __init__(self, *, seed: int = 0, stores: int = 2, coordinators: int = 1,
                 data_partitions: int = 2, copiers: int = 0, verbose: bool = False,
                 replicated: bool = False, converge_limit_s: float = CONVERGE_LIMIT_S) -> None:
        if replicated:
            stores = REPLICATED_STORES
        layout = ClusterLayout(
            stores=tuple(f"store-{i}:0" for i in range(stores)),
            coordinators=tuple(f"coordinator-{i}:0" for i in range(coordinators)),
            group_coordinators=("group-coordinator-0:0",) if copiers else (),
            transaction_state_partitions=1, consumer_offsets_partitions=1,
        )
        self.sim = Simulation(seed, faults=False, verbose=verbose, layout=layout,
                              data_partitions=data_partitions, check_every_steps=1,
                              copiers=copiers, replicated=replicated,
                              converge_limit_s=converge_limit_s,
                              # Its copier is driven call by call, outside
                              # the group protocol.
                              membership=False)
        self.net = self.sim.net
        self.loop = self.sim.loop
        self.layout = layout
        # What the script observed, for the test to look at after the run.
        self.notes: dict[str, object] = {}

    # ---------------------------------------------------------------- run

    def run(self, script: Callable[[Scenario], Awaitable[None]]) -> SimResult:
        """Sets the cluster up, runs the script, quiesces, checks."""
        async def main() -> None:
            await self.sim.setup()
            await self.until(self._coordinators_loaded, what="the coordinators loaded")
            await script(self)
            await self.sim.quiesce()
            self.sim.check_final()

        logging.disable(logging.NOTSET if self.sim.verbose else logging.CRITICAL)
        try:
            return self.sim.run(main)
        finally:
            logging.disable(logging.NOTSET)

    def trace(self, line: str) -> None:
        self.sim.trace(f"SCRIPT {line}")

    # ---------------------------------------------------------------- time

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def until(self, predicate: Callable[[], bool], *, timeout_s: float = 120.0,
                    what: str = "") -> None:
        """Waits (in simulated time) until predicate() holds."""
        deadline_s = self.loop.time() + timeout_s
        while not predicate():
            if self.loop.time() > deadline_s:
                raise ScheduleStuck(f"waited {timeout_s:.0f} s for {what or predicate}")
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------ messages

    def hold(self, *parts: str, count: int | None = 1) -> Hold:
        return self.net.hold(*parts, count=count)

    def drop(self, *parts: str, count: int | None = 1) -> Hold:
        return self.net.hold(*parts, count=count, drop=True)

    def release(self, rule: Hold) -> list[str]:
        return self.net.release(rule)

    def route(self, name: str, incarnation: Incarnation | None) -> None:
        """Every request for node `name` reaches `incarnation` (None: its
        current one again)."""
        if incarnation is None:
            self.net.route_to.pop(name, None)
        else:
            self.net.route_to[name] = incarnation
        self.trace(f"route {name} -> {incarnation or 'current'}")

    # --------------------------------------------------------------- nodes

    def coordinator(self, node_id: int = 0) -> Incarnation:
        return self.net.current(coordinator_name(node_id))

    def coordinator_runtime(self, incarnation: Incarnation) -> TxnCoordinatorRuntime:
        runtime = incarnation.runtime
        assert isinstance(runtime, TxnCoordinatorRuntime)  # noqa: S101 - harness use
        return runtime

    def store_node(self, partition: int, topic: str = DATA_TOPIC) -> int:
        """The store that holds the partition (on a replicated cluster: its
        leader now, by the metadata store; -1 while it has none)."""
        if self.sim.replicated:
            state = self.sim._partition_state(topic, partition)
            return -1 if state is None else state.leader
        return self.layout.store_for(topic, partition)

    def store(self, node_id: int) -> Incarnation:
        return self.net.current(store_name(node_id))

    def store_runtime(self, node_id: int) -> StoreRuntime:
        runtime = self.store(node_id).runtime
        assert isinstance(runtime, StoreRuntime)  # noqa: S101 - harness use
        return runtime

    def pause(self, incarnation: Incarnation) -> None:
        incarnation.pause()
        self.trace(f"PAUSE {incarnation}")

    def resume(self, incarnation: Incarnation) -> None:
        incarnation.resume()
        self.trace(f"RESUME {incarnation}")

    def crash(self, incarnation: Incarnation) -> None:
        incarnation.kill()
        self.trace(f"CRASH {incarnation}")

    def restart_store(self, node_id: int) -> Incarnation:
        return self.sim.start_store(node_id)

    def restart_coordinator(self, node_id: int = 0) -> Incarnation:
        return self.sim.start_coordinator(node_id)

    async def replace_coordinator(self, node_id: int = 0) -> tuple[Incarnation, Incarnation]:
        """Pauses the coordinator's process and starts a new one, which loads
        (claims a higher coordinator epoch); returns (old, new)."""
        old = self.coordinator(node_id)
        self.pause(old)
        new = self.sim.start_coordinator(node_id)
        await self.until(self._coordinators_loaded, what=f"{new} loaded")
        return old, new

    def _coordinators_loaded(self) -> bool:
        for node_id in range(len(self.layout.coordinators)):
            runtime = self.coordinator(node_id).runtime
            if not isinstance(runtime, TxnCoordinatorRuntime):
                return False
            if not all(o.loaded for o in runtime.partitions.values()):
                return False
        return True

    # ------------------------------------------------------------- clients

    def producer(self, transactional_id: str, instance: int = 0, *,
                 version_1: bool = False) -> TxnProducer:
        """`version_1`: the transactional id runs transaction version 1
        (Kafka's clients), as do its later instances."""
        if version_1:
            self.sim.version_1_ids.add(transactional_id)
        return self.sim.start_producer(transactional_id, instance, run=False)

    def copier(self, index: int = 0, instance: int = 0) -> Copier:
        """Copier `index` of the read-process-write workload (the Scenario
        needs `copiers`), driven step by step like a producer."""
        return self.sim.start_copier(index, instance, run=False)

    def start(self, producer: TxnProducer, step: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Starts one step of a producer as a task of its process."""
        return producer.me.spawn(step)

    async def do(self, producer: TxnProducer, step: Coroutine[Any, Any, T]) -> T:
        """Runs one step of a producer, as a task of its process, to its end."""
        return await self.start(producer, step)


__all__ = ["Scenario", "ScheduleStuck"]
