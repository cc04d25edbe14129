"""Simulated nodes, network and disk, and the port adapters that use them.

Goal: the production runtimes talk to each other only through ports
(`TxnLog`, `MarkerSender`, `ProducerIdLog`, `TxnVerifier`, `ControllerLink`,
the replica fetcher manager's `LeaderLink`, the group coordinator's `OffsetsStore`,
the store's `KeyValueStore`). In
production a gRPC adapter implements each; here an adapter of the same port
turns every call into a message in the simulated network, and the runtime at
the other end handles it by calling the same runtime method its servicer
calls. Nothing of a runtime is copied.

Method:

* A **node incarnation** (`Incarnation`) is one process: its tasks run in a
  context marked with it (loop.NODE), so the loop can park them while it is
  paused and drop them once it is dead. Restarting a node makes a new
  incarnation from the node's durable state (its `SimDisk`).
* **The network** (`Network.call`) delivers a request after a seeded delay,
  or loses it, or delivers it twice; the answer travels back the same way.
  A call made with `once` is never delivered twice: Kafka's protocol runs
  over TCP, which does not duplicate a request, and transaction version 1
  relies on that (a late second copy of a producer's EndTxn would end its
  next transaction, which shares the epoch; docs/coordinator.md).
  The caller waits at most the timeout its real gRPC adapter uses, then
  raises `RpcTimeout`; a request to a dead process fails with
  `RpcUnavailable` (a refused connection). Each adapter maps those to the
  error codes its gRPC counterpart raises (DEADLINE_EXCEEDED ->
  REQUEST_TIMED_OUT, UNAVAILABLE -> NETWORK_EXCEPTION, and then as the
  adapter does: the verifier says COORDINATOR_NOT_AVAILABLE, the
  controller link LEADER_NOT_AVAILABLE).
* **Routing**: a request goes to the node's current incarnation; while an
  older incarnation of a transaction coordinator is still alive (a zombie:
  paused, then replaced, then resumed), a share of the requests reach it
  instead, as through a connection opened before the replacement.
* **Scripted schedules** (script.py) steer the same network by hand: a
  `Hold` rule holds back or drops the messages whose description matches,
  `release` delivers what it held, and `route_to` sends every request for a
  node to one incarnation (a zombie, say).
* **The disk** of a store node is one `MemoryStore` that outlives its
  incarnations: what the runtime wrote to it survives a crash, as a write
  with fsync off survives kill -9 of RocksDB's process; what it had only
  queued (the group-commit writer's queue) dies with the process. On a
  replicated run it is a `SimDisk`, which can also lose what the kernel had
  not written back (a machine crash) or be replaced by an empty one.
* **Leaders**: on a replicated run every client process finds a
  partition's leader through Metadata (`SimLeaderDirectory`, as
  services/common/rpc/leaders.py and the SDK do), and followers reach theirs
  through `SimLeaderLink`; `Network.cut_links` and `Network.isolated` are
  network partitions.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from oncelog import records
from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import (
    PRODUCER_IDS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    ClusterLayout,
)
from services.common.rpc.leaders import METADATA_RPC_TIMEOUT_S, MOVED_CODES
from services.common.rpc.store_client import STORE_RPC_TIMEOUT_S, RawRead, TxnWriter
from services.coordinator.core.hanging import StoreAnswer, StoreQuestion
from services.coordinator.core.producer_ids import ProducerIdBlock, decode_block, encode_block
from services.coordinator.markers import MARKER_RPC_TIMEOUT_S, MarkerSpec
from services.coordinator.storage.producer_id_log import BLOCK_KEY
from services.coordinator.storage.txn_log import Entry
from services.coordinator.txn_runtime import TxnCoordinatorRuntime
from services.group_coordinator.runtime import GroupCoordinatorRuntime
from services.partition_store.api import (
    EpochEndOutcome,
    FetchItem,
    MarkerItem,
    NewPartitions,
    OffsetQuery,
    ProduceItem,
    ReplicaFetchItem,
    ReplicaFetchOutcome,
    TopicOutcome,
    TopicSpec,
)
from services.partition_store.core.outcomes import Rejection
from services.partition_store.core.replicas import PartitionState
from services.partition_store.core.topics import TopicRecord
from services.partition_store.log.partition import Isolation
from services.partition_store.rpc.coordinator_link import RESOLVE_TIMEOUT_S as RESOLVE_RPC_TIMEOUT_S
from services.partition_store.rpc.replica_link import (
    PARTITION_STATES_TIMEOUT_S,
    REPLICA_RPC_TIMEOUT_S,
)
from services.partition_store.runtime import StoreRuntime
from services.partition_store.storage.memory import MemoryStore
from services.partition_store.storage.port import WriteGroup
from services.partition_store.transactions.resolver import (
    Answers,
    CoordinatorAnswer,
    HangingQuestion,
)
from services.partition_store.transactions.verifier import TopicPartitionKey, VerifyAnswer
from tests.sim.real.loop import NODE, DeterministicLoop

T = TypeVar("T")

# The real adapters' deadlines (seconds): coordinator_link.GrpcTxnVerifier and
# controller_link.GrpcControllerLink default to 5 s; the store client and the
# marker sender use their module constants.
VERIFY_TIMEOUT_S = 5.0
RESOLVE_TIMEOUT_S = RESOLVE_RPC_TIMEOUT_S
CONTROLLER_TIMEOUT_S = 5.0
STORE_TIMEOUT_S = STORE_RPC_TIMEOUT_S
MARKER_TIMEOUT_S = MARKER_RPC_TIMEOUT_S


class RpcTimeout(Exception):
    """No answer within the deadline (gRPC DEADLINE_EXCEEDED)."""


class RpcUnavailable(Exception):
    """The process at the address is dead (gRPC UNAVAILABLE)."""


def transport_error(exc: Exception) -> ErrorCode:
    """The code the SDK's error_from_rpc gives a failed call."""
    if isinstance(exc, RpcTimeout):
        return ErrorCode.REQUEST_TIMED_OUT
    return ErrorCode.NETWORK_EXCEPTION


# ------------------------------------------------------------------ nodes


class Incarnation:
    """One process of a node: paused or running until it dies."""

    def __init__(self, loop: DeterministicLoop, name: str, number: int) -> None:
        self.loop = loop
        self.name = name
        self.number = number
        self.paused = False
        self.dead = False
        self.parked: list[asyncio.Handle] = []
        self.runtime: Any = None
        # A store serves once its wiring has started (the real server
        # listens only then: recovered, and on a replicated cluster with the
        # partition states applied).
        self.serving = False
        self._context = contextvars.copy_context()
        self._context.run(NODE.set, self)

    def __repr__(self) -> str:
        return f"{self.name}#{self.number}"

    def spawn(self, coro: Awaitable[T]) -> asyncio.Task[T]:
        """Runs a coroutine as a task of this process."""
        return self.loop.create_task(coro, context=self._context.copy())  # type: ignore[arg-type]

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if self.paused and not self.dead:
            self.paused = False
            self.loop.resume(self)

    def kill(self) -> None:
        self.dead = True
        self.paused = False
        self.loop.bury(self)


# ---------------------------------------------------------------- network


@dataclass(slots=True)
class FaultProfile:
    """Per-message fault odds, chosen per seed (all zero: a perfect network)."""

    drop: float = 0.0
    duplicate: float = 0.0
    # A slow message takes up to slow_ms_max: long enough to outlive its
    # caller's deadline, and to arrive after later messages.
    slow: float = 0.0
    slow_ms_max: int = 12_000
    # Share of requests to a node that reach a live older incarnation.
    zombie_route: float = 0.3
    # Odds that a store process dies right after sending a successful answer
    # (before anything else of it runs): nothing it acknowledged may be lost.
    crash_after_reply: float = 0.0
    # Odds that a store process dies as a request reaches it (just before or
    # just after it starts handling it, as the seed orders them): with a
    # write taken but not yet group-committed, the write is lost.
    crash_on_request: float = 0.0


@dataclass(slots=True, eq=False)
class Hold:
    """A scripted schedule's rule: the next `count` messages whose description
    contains every one of `parts` are held back (or dropped) instead of sent.
    A description is `src->dst what` for a request, `dst->src what <answer>`
    for its answer, with node incarnations written `name#number`."""

    parts: tuple[str, ...]
    drop: bool = False
    # How many messages the rule still takes (None: every one until removed).
    count: int | None = 1
    # (description, delivery) of each message held, in the order sent.
    held: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def matches(self, what: str) -> bool:
        return (self.count is None or self.count > 0) and all(p in what for p in self.parts)


class Network:
    def __init__(self, loop: DeterministicLoop, rng: random.Random,
                 trace: Callable[[str], None]) -> None:
        self._loop = loop
        self._rng = rng
        self._trace = trace
        self.faults = FaultProfile()
        # Every incarnation of each node, the current one last.
        self.nodes: dict[str, list[Incarnation]] = {}
        self._root = contextvars.copy_context()
        self._root.run(NODE.set, None)
        self.messages = 0
        # Exceptions a handler raised that are not ServiceErrors: a runtime bug.
        self.handler_errors: list[str] = []
        # Scripted schedules: rules that hold or drop matching messages, and
        # node name -> the incarnation every request to it reaches.
        self.holds: list[Hold] = []
        self.route_to: dict[str, Incarnation] = {}
        # Called with a store incarnation to crash (crash_after_reply,
        # crash_on_request) and why.
        self.on_store_crash: Callable[[Incarnation, str], None] | None = None
        # Network partitions: pairs of node names that cannot reach each
        # other (both ways), and nodes cut off from every other node.
        self.cut_links: set[frozenset[str]] = set()
        self.isolated: set[str] = set()

    def cut(self, a: str, b: str) -> bool:
        """Whether messages between nodes `a` and `b` are lost (a network
        partition between them)."""
        if a == b:
            return False
        return a in self.isolated or b in self.isolated or frozenset((a, b)) in self.cut_links

    def add(self, incarnation: Incarnation) -> None:
        self.nodes.setdefault(incarnation.name, []).append(incarnation)

    def current(self, name: str) -> Incarnation:
        return self.nodes[name][-1]

    # ------------------------------------------------ scripted schedules

    def hold(self, *parts: str, count: int | None = 1, drop: bool = False) -> Hold:
        """Holds back (or, with drop, loses) the next `count` messages whose
        description contains every part; `release` delivers what it held."""
        rule = Hold(tuple(parts), drop=drop, count=count)
        self.holds.append(rule)
        return rule

    def release(self, rule: Hold, *, delay_s: float = 0.0) -> list[str]:
        """Stops the rule and delivers what it held, in the order it was
        sent, `delay_s` from now; returns their descriptions."""
        if rule in self.holds:
            self.holds.remove(rule)
        released = [what for what, _ in rule.held]
        for what, deliver in rule.held:
            self._trace(f"RELEASE {what}")
            self._loop.call_later(delay_s, deliver, context=self._root)
        rule.held.clear()
        return released

    def _scripted(self, what: str, callback: Callable[[], None]) -> bool:
        """Whether a hold rule took the message."""
        for rule in self.holds:
            if rule.matches(what):
                if rule.count is not None:
                    rule.count -= 1
                if rule.drop:
                    self._trace(f"DROP (scripted) {what}")
                else:
                    self._trace(f"HOLD {what}")
                    rule.held.append((what, callback))
                return True
        return False

    def _route(self, name: str) -> Incarnation:
        if name in self.route_to:
            return self.route_to[name]
        incarnations = self.nodes[name]
        zombies = [i for i in incarnations[:-1] if not i.dead]
        if zombies and self._rng.random() < self.faults.zombie_route:
            return self._rng.choice(zombies)
        return incarnations[-1]

    def _delay_s(self) -> float:
        if self._rng.random() < self.faults.slow:
            return self._rng.randint(1, self.faults.slow_ms_max) / 1000
        return self._rng.randint(100, 3000) / 1_000_000

    def _send(self, what: str, callback: Callable[[], None],
              link: tuple[str, str] | None = None, *, once: bool = False) -> None:
        """Schedules a message's arrival (or loses it, or sends it twice
        unless `once`); `link`: (sender, receiver) node names, for network
        partitions."""
        self.messages += 1
        if self.holds and self._scripted(what, callback):
            return
        if link is not None and (self.cut_links or self.isolated) and self.cut(*link):
            self._trace(f"CUT {what}")
            return
        faults = self.faults
        if self._rng.random() < faults.drop:
            self._trace(f"DROP {what}")
            return
        self._trace(f"send {what}")
        copies = 2 if self._rng.random() < faults.duplicate and not once else 1
        if copies == 2:
            self._trace(f"DUPLICATE {what}")
        for _ in range(copies):
            self._loop.call_later(self._delay_s(), callback, context=self._root)

    async def call(self, src: Incarnation, dst: str, what: str,
                   op: Callable[[Incarnation], Awaitable[T]], *, timeout_s: float,
                   once: bool = False) -> T:
        """Sends `op` (a call on the destination's runtime) and waits for its
        answer; raises what it raised, RpcTimeout or RpcUnavailable.
        `once`: the request is never duplicated (see the module's doc)."""
        reply: asyncio.Future[T] = self._loop.create_future()

        def answer(result: T | None, error: BaseException | None) -> None:
            if reply.done():
                return
            if error is not None:
                reply.set_exception(error)
            else:
                reply.set_result(result)  # type: ignore[arg-type]

        def arrive() -> None:
            target = self._route(dst)
            if target.dead:
                self._send(f"{dst}->{src} unavailable",
                           lambda: answer(None, RpcUnavailable(f"{dst} is down")),
                           (dst, src.name))
                return
            target.spawn(self._serve(target, src, what, op, answer))
            if self.faults.crash_on_request and self.on_store_crash is not None \
                    and target.name.startswith("store-") \
                    and self._rng.random() < self.faults.crash_on_request:
                self._loop.call_soon(self.on_store_crash, target, f"as {what} arrived",
                                     context=self._root)

        self._send(f"{src}->{dst} {what}", arrive, (src.name, dst), once=once)
        try:
            return await asyncio.wait_for(reply, timeout_s)
        except TimeoutError:
            raise RpcTimeout(f"{src}->{dst} {what}: no answer in {timeout_s:.0f} s") from None

    async def _serve(self, target: Incarnation, src: Incarnation, what: str,
                     op: Callable[[Incarnation], Awaitable[T]],
                     answer: Callable[[T | None, BaseException | None], None]) -> None:
        try:
            result = await op(target)
        except ServiceError as exc:
            refusal = exc  # `exc` is unbound after the except clause
            self._send(f"{target}->{src} {what} {exc.code.name}",
                       lambda: answer(None, refusal), (target.name, src.name))
            return
        except Exception as exc:  # a runtime bug: the servicer would answer UNKNOWN
            self.handler_errors.append(f"{target} {what}: {exc!r}")
            error = ServiceError(ErrorCode.UNKNOWN_SERVER_ERROR, repr(exc))
            self._send(f"{target}->{src} {what} UNKNOWN", lambda: answer(None, error),
                       (target.name, src.name))
            return
        self._send(f"{target}->{src} {what} ok", lambda: answer(result, None),
                   (target.name, src.name))
        if self.faults.crash_after_reply and self.on_store_crash is not None \
                and target.name.startswith("store-") \
                and self._rng.random() < self.faults.crash_after_reply:
            self.on_store_crash(target, f"right after answering {what}")


def store_name(node_id: int) -> str:
    return f"store-{node_id}"


def coordinator_name(node_id: int) -> str:
    return f"coordinator-{node_id}"


def group_coordinator_name(node_id: int) -> str:
    return f"group-coordinator-{node_id}"


def serving_store(target: Incarnation) -> StoreRuntime:
    """The store runtime of a process that serves (raises what a client of
    a server that does not listen yet gets)."""
    runtime = target.runtime
    if not isinstance(runtime, StoreRuntime):
        raise ServiceError(ErrorCode.NETWORK_EXCEPTION, f"{target} is still starting")
    if not runtime.started or not target.serving:
        # The real server starts listening only once recovered.
        raise ServiceError(ErrorCode.NETWORK_EXCEPTION, f"{target} is still starting")
    return runtime



def _coordinator(target: Incarnation) -> TxnCoordinatorRuntime:
    runtime = target.runtime
    if not isinstance(runtime, TxnCoordinatorRuntime):
        raise ServiceError(ErrorCode.NETWORK_EXCEPTION, f"{target} is still starting")
    return runtime


def _group_coordinator(target: Incarnation) -> GroupCoordinatorRuntime:
    runtime = target.runtime
    if not isinstance(runtime, GroupCoordinatorRuntime):
        raise ServiceError(ErrorCode.NETWORK_EXCEPTION, f"{target} is still starting")
    return runtime


# ------------------------------------------------------ where leaders are


class SimLeaderDirectory:
    """Where each partition's leader is, for one client process: what
    services/common/leaders.LeaderDirectory (the coordinators) and the SDK's
    metadata cache do over gRPC. On a replicated cluster (`follow`) it asks
    the stores in turn for Metadata (the store runtime's `metadata` and
    `partition_state`, which its servicer's answer is made of), caches each
    partition's leader and leader epoch, and forgets one when a call to it
    fails with a code that says it may have moved (leaders.MOVED_CODES).
    With single copies the leader is the layout's `store_for`, as every
    process computes it, and Metadata comes from the catalog's store."""

    def __init__(self, net: Network, me: Incarnation, layout: ClusterLayout, *,
                 follow: bool) -> None:
        self._net = net
        self._me = me
        self._layout = layout
        self.follow = follow
        self._leaders: dict[tuple[str, int], tuple[int, int]] = {}
        self._counts: dict[str, int] = {}
        self._next_store = itertools.cycle(range(len(layout.stores)))
        self._lock = asyncio.Lock()

    async def leader(self, topic: str, partition: int) -> int:
        """The node id of the partition's leader (asks when not cached);
        raises LEADER_NOT_AVAILABLE when no store names one."""
        return (await self.leader_and_epoch(topic, partition))[0]

    async def leader_and_epoch(self, topic: str, partition: int) -> tuple[int, int | None]:
        """(leader node id, its leader epoch; None: not known)."""
        if not self.follow:
            return self._layout.store_for(topic, partition), None
        found = self._leaders.get((topic, partition))
        if found is None:
            await self.refresh([topic])
            found = self._leaders.get((topic, partition))
        if found is None:
            raise ServiceError(ErrorCode.LEADER_NOT_AVAILABLE,
                               f"no store named a leader for {topic}-{partition}; retry")
        return found

    def forget_on(self, topic: str, partition: int, code: ErrorCode) -> None:
        """Forgets the cached leader when `code` says it may have moved."""
        if code in MOVED_CODES:
            self._leaders.pop((topic, partition), None)

    async def refresh(self, topics: list[str]) -> None:
        """Asks the stores in turn for the topics' metadata until one answers."""
        async def op(target: Incarnation) -> list[tuple[str, list[tuple[int, int]]]]:
            store = serving_store(target)
            lookups = await store.metadata(topics, include_internal=True)
            return [(lk.name, [(state.leader, state.leader_epoch) for state in (
                store.partition_state(lk.name, p) for p in range(lk.record.partitions))])
                for lk in lookups if lk.record is not None]

        async with self._lock:
            last: Exception | None = None
            for _ in range(len(self._layout.stores)):
                node = next(self._next_store)
                try:
                    answer = await self._net.call(self._me, store_name(node), f"metadata {topics}",
                                                  op, timeout_s=METADATA_RPC_TIMEOUT_S)
                except (ServiceError, RpcTimeout, RpcUnavailable) as exc:
                    last = exc
                    continue
                for name in topics:
                    self._counts.pop(name, None)
                for name, leaders in answer:
                    self._counts[name] = len(leaders)
                    for p, (leader, epoch) in enumerate(leaders):
                        if leader >= 0:
                            self._leaders[(name, p)] = (leader, epoch)
                        else:
                            self._leaders.pop((name, p), None)
                return
            raise ServiceError(ErrorCode.LEADER_NOT_AVAILABLE,
                               f"no store answered Metadata: {last}")

    async def partition_counts(self, topics: list[str]) -> dict[str, int]:
        """Partition counts of existing topics (a missing one is left out)."""
        if self.follow:
            await self.refresh(topics)
            return {t: self._counts[t] for t in topics if t in self._counts}

        async def op(target: Incarnation) -> dict[str, int]:
            lookups = await serving_store(target).metadata(topics, include_internal=True)
            return {lk.name: lk.record.partitions for lk in lookups if lk.record is not None}

        try:
            return await self._net.call(self._me, store_name(self._layout.controller_node_id),
                                        "metadata", op, timeout_s=STORE_TIMEOUT_S)
        except (RpcTimeout, RpcUnavailable) as exc:
            raise ServiceError(transport_error(exc), str(exc)) from None


# ------------------------------------------- the store client's three calls


class SimStoreClient:
    """What services/common/store_client.StoreClient does over gRPC, as
    messages: append (Produce with coordinator_write, optionally as a
    producer's transactional batch), read (Fetch, read_committed), read
    batches (Fetch, read_uncommitted with markers, a long poll), log end
    (ListOffsets), partition counts (Metadata). It is the group
    coordinator's `OffsetsStore` as it is. Each call goes to the
    partition's leader (`SimLeaderDirectory`), forgotten on an answer that
    says it moved, as StoreClient does."""

    def __init__(self, net: Network, me: Incarnation, layout: ClusterLayout, *,
                 follow_leaders: bool = False) -> None:
        self._net = net
        self._me = me
        self._layout = layout
        self._leaders = SimLeaderDirectory(net, me, layout, follow=follow_leaders)

    async def _call(self, topic: str, partition: int, what: str,
                    op: Callable[[StoreRuntime], Awaitable[T]], *,
                    timeout_s: float = STORE_TIMEOUT_S) -> T:
        try:
            dst = store_name(await self._leaders.leader(topic, partition))
            return await self._net.call(self._me, dst, what, lambda t: op(serving_store(t)),
                                        timeout_s=timeout_s)
        except (RpcTimeout, RpcUnavailable) as exc:
            code = transport_error(exc)
            self._leaders.forget_on(topic, partition, code)
            raise ServiceError(code, str(exc)) from None
        except ServiceError as exc:
            self._leaders.forget_on(topic, partition, exc.code)
            raise

    async def append(self, topic: str, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int | None = None, now_ms: int | None = None,
                     producer: TxnWriter | None = None) -> int:
        """StoreClient.append: one batch, conditional on the log end; with
        `producer`, a transactional batch of that producer (the group
        coordinator's transactional offsets)."""
        rows = [(k, v, None, now_ms or 0) for k, v in entries]
        if producer is None:
            batch = records.encode_batch(rows)
        else:
            batch = records.encode_batch(
                rows, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
                base_sequence=producer.base_sequence, transactional=True)
        item = ProduceItem(topic, partition, batch, expected_log_end_offset)

        async def op(store: StoreRuntime) -> int:
            (outcome,) = await store.produce(
                [item], timeout_ms=int(STORE_TIMEOUT_S * 1000), coordinator_write=True,
                transactional_id=producer.transactional_id if producer else "",
                add_partitions_to_txn=producer.add_partitions_to_txn if producer else False,
            )
            if outcome.error is not None:
                raise outcome.error
            return outcome.base_offset

        what = f"append {topic}-{partition}"
        if producer is not None:
            what += (f" pid={producer.producer_id} epoch={producer.producer_epoch} "
                     f"seq={producer.base_sequence}")
        return await self._call(topic, partition, what, op)

    async def read_batches(self, topic: str, partition: int, from_offset: int, *,
                           max_wait_ms: int = 0, max_bytes: int = 8 << 20) -> RawRead:
        """StoreClient.read_batches: whole batches under read_uncommitted,
        markers included; with max_wait_ms, a long poll."""
        async def op(store: StoreRuntime) -> RawRead:
            (outcome,) = await store.fetch(
                [FetchItem(topic, partition, from_offset, max_bytes)],
                max_wait_ms=max_wait_ms, min_bytes=1 if max_wait_ms else 0,
                max_bytes=max_bytes, isolation=Isolation.READ_UNCOMMITTED,
                include_control=True,
            )
            if outcome.error is not None:
                raise outcome.error
            return RawRead(list(outcome.batches), max(outcome.next_fetch_offset, from_offset),
                           outcome.high_watermark)

        return await self._call(topic, partition, f"read-batches {topic}-{partition}", op,
                                timeout_s=STORE_TIMEOUT_S + max_wait_ms / 1000)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """StoreClient.partition_counts: Metadata from a store."""
        if not topics:
            return {}
        return await self._leaders.partition_counts(list(topics))

    async def read(self, topic: str, partition: int,
                   from_offset: int) -> tuple[list[Entry], int, int]:
        """(entries, next offset, high watermark), read_committed."""
        async def op(store: StoreRuntime) -> tuple[list[Entry], int, int]:
            (outcome,) = await store.fetch(
                [FetchItem(topic, partition, from_offset, 8 << 20)],
                isolation=Isolation.READ_COMMITTED,
            )
            if outcome.error is not None:
                raise outcome.error
            entries: list[Entry] = [
                (r.key, r.value) for b in outcome.batches
                for r in records.iter_records(b, min_offset=from_offset)
            ]
            return entries, max(outcome.next_fetch_offset, from_offset), outcome.high_watermark

        return await self._call(topic, partition, f"read {topic}-{partition}", op)

    async def read_to_end(self, topic: str, partition: int) -> tuple[list[Entry], int]:
        entries: list[Entry] = []
        offset = 0
        while True:
            got, next_offset, high_watermark = await self.read(topic, partition, offset)
            entries.extend(got)
            if next_offset <= offset or next_offset >= high_watermark:
                return entries, high_watermark
            offset = next_offset

    async def log_end_offset(self, topic: str, partition: int) -> int:
        async def op(store: StoreRuntime) -> int:
            (outcome,) = await store.list_offsets(
                [OffsetQuery(topic, partition, -1)], isolation=Isolation.READ_UNCOMMITTED
            )
            if outcome.error is not None:
                raise outcome.error
            return outcome.offset

        return await self._call(topic, partition, f"log-end {topic}-{partition}", op)


class SimTxnLog:
    """The TxnLog port (storage/txn_log.StoreTxnLog) over the simulated store."""

    def __init__(self, client: SimStoreClient, now_ms: Callable[[], int]) -> None:
        self._client = client
        self._now_ms = now_ms

    async def read_all(self, partition: int) -> tuple[list[Entry], int]:
        return await self._client.read_to_end(TRANSACTION_STATE_TOPIC, partition)

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        base = await self._client.append(
            TRANSACTION_STATE_TOPIC, partition, entries,
            expected_log_end_offset=expected_log_end_offset, now_ms=self._now_ms(),
        )
        return base + len(entries)

    async def log_end_offset(self, partition: int) -> int:
        return await self._client.log_end_offset(TRANSACTION_STATE_TOPIC, partition)


class SimProducerIdLog:
    """The ProducerIdLog port (storage/producer_id_log.StoreProducerIdLog)."""

    def __init__(self, client: SimStoreClient, now_ms: Callable[[], int]) -> None:
        self._client = client
        self._now_ms = now_ms

    async def read_last(self) -> tuple[ProducerIdBlock | None, int]:
        log_end = await self._client.log_end_offset(PRODUCER_IDS_TOPIC, 0)
        if log_end == 0:
            return None, 0
        entries, _next, _hw = await self._client.read(PRODUCER_IDS_TOPIC, 0, log_end - 1)
        if not entries or entries[-1][1] is None:
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               f"{PRODUCER_IDS_TOPIC} ends at {log_end} but its last record "
                               "could not be read")
        value = entries[-1][1]
        return decode_block(value), log_end

    async def append(self, block: ProducerIdBlock, *, expected_log_end_offset: int) -> None:
        await self._client.append(
            PRODUCER_IDS_TOPIC, 0, [(BLOCK_KEY, encode_block(block))],
            expected_log_end_offset=expected_log_end_offset, now_ms=self._now_ms(),
        )


class SimMarkerSender:
    """The MarkerSender port (markers.GrpcMarkerSender): one WriteTxnMarkers
    message per store node that leads some of the partitions, following
    leaders as they move."""

    def __init__(self, net: Network, me: Incarnation, layout: ClusterLayout, *,
                 follow_leaders: bool = False) -> None:
        self._net = net
        self._me = me
        self._layout = layout
        self._leaders = SimLeaderDirectory(net, me, layout, follow=follow_leaders)

    async def write(self, spec: MarkerSpec,
                    partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        by_node: dict[int, list[tuple[str, int]]] = {}
        results: dict[tuple[str, int], ErrorCode] = {}
        for tp in partitions:
            try:
                leader = await self._leaders.leader(*tp)
            except ServiceError as exc:
                results[tp] = exc.code
                continue
            by_node.setdefault(leader, []).append(tp)
        for node, tps in sorted(by_node.items()):
            item = MarkerItem(
                spec.producer_id, spec.producer_epoch,
                records.MARKER_COMMIT if spec.commit else records.MARKER_ABORT,
                spec.coordinator_epoch, tuple(tps), spec.transactional_id,
                transaction_version=int(spec.transaction_version),
                timestamp_ms=spec.timestamp_ms,
            )

            async def op(target: Incarnation, item: MarkerItem = item) -> list[tuple[
                    tuple[str, int], ErrorCode]]:
                outcomes = await serving_store(target).write_txn_markers(
                    [item], timeout_ms=int(MARKER_TIMEOUT_S * 1000))
                return [((o.topic, o.partition), ErrorCode.NONE if o.error is None
                         else o.error.code) for o in outcomes]

            what = (f"marker {'COMMIT' if spec.commit else 'ABORT'} pid={spec.producer_id} "
                    f"epoch={spec.producer_epoch}"
                    + (f" v1@{spec.timestamp_ms}" if spec.timestamp_ms else "") + f" {tps}")
            try:
                answered = await self._net.call(self._me, store_name(node), what, op,
                                                timeout_s=MARKER_TIMEOUT_S)
            except ServiceError as exc:
                answered = [(tp, exc.code) for tp in tps]
            except (RpcTimeout, RpcUnavailable) as exc:
                answered = [(tp, transport_error(exc)) for tp in tps]
            results.update(answered)
            for tp, code in answered:
                self._leaders.forget_on(tp[0], tp[1], code)
            for tp in tps:
                results.setdefault(tp, ErrorCode.UNKNOWN_SERVER_ERROR)
        return results


class SimTxnVerifier:
    """The TxnVerifier port (coordinator_link.GrpcTxnVerifier): the store asks
    the coordinator of the transactional id, which answers as its servicer's
    AddPartitionsToTxn does (verify_only: verify_partitions; else
    add_partitions, every partition then verified)."""

    def __init__(self, net: Network, me: Incarnation, layout: ClusterLayout) -> None:
        self._net = net
        self._me = me
        self._layout = layout

    async def verify(self, *, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: Sequence[TopicPartitionKey], add: bool = False,
                     ) -> VerifyAnswer:
        layout = self._layout
        node = layout.coordinator_for_partition(
            layout.transaction_state_partition(transactional_id))

        async def op(target: Incarnation) -> tuple[dict[TopicPartitionKey, Rejection | None],
                                                   int]:
            coordinator = _coordinator(target)
            if add:
                await coordinator.add_partitions(transactional_id, producer_id,
                                                 producer_epoch, frozenset(partitions))
                return (dict.fromkeys(partitions),
                        coordinator.transaction_timeout_ms(transactional_id))
            verdicts = await coordinator.verify_partitions(
                transactional_id, producer_id, producer_epoch, partitions)
            return ({tp: None if e is None else Rejection(e.code, e.message)
                     for tp, e in verdicts.items()},
                    coordinator.transaction_timeout_ms(transactional_id))

        what = (f"{'add' if add else 'verify'} {transactional_id} pid={producer_id} "
                f"epoch={producer_epoch} {list(partitions)}")
        try:
            answered, timeout_ms = await self._net.call(
                self._me, coordinator_name(node), what, op, timeout_s=VERIFY_TIMEOUT_S)
        except (RpcTimeout, RpcUnavailable) as exc:
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)) from None
        return VerifyAnswer(
            {tp: answered.get(tp, Rejection(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer"))
             for tp in partitions}, timeout_ms)

    async def close(self) -> None:
        """Nothing to release."""


class SimTxnResolver:
    """The TxnResolver port (coordinator_link.GrpcTxnResolver): the store
    asks every coordinator about a transaction it holds open past its
    timeout; each answers for the `__transaction_state` partitions the
    layout gives it, as its servicer's ResolveTransaction does."""

    def __init__(self, net: Network, me: Incarnation, layout: ClusterLayout) -> None:
        self._net = net
        self._me = me
        self._layout = layout

    async def resolve(self, question: HangingQuestion) -> Answers:
        layout = self._layout
        store_question = StoreQuestion(
            producer_id=question.producer_id, producer_epoch=question.producer_epoch,
            topic_partition=(question.topic, question.partition),
            last_marker_timestamp_ms=question.last_marker_timestamp_ms)

        async def op(target: Incarnation) -> dict[int, StoreAnswer | ServiceError]:
            return await _coordinator(target).resolve_transaction(store_question)

        answers: dict[int, CoordinatorAnswer] = {}
        for node in range(len(layout.coordinators)):
            what = (f"resolve pid={question.producer_id} epoch={question.producer_epoch} "
                    f"{question.topic}-{question.partition}")
            try:
                answered = await self._net.call(self._me, coordinator_name(node), what, op,
                                                timeout_s=RESOLVE_TIMEOUT_S)
            except (RpcTimeout, RpcUnavailable, ServiceError):
                continue
            for partition, found in answered.items():
                if (not isinstance(found, ServiceError)
                        and layout.coordinator_for_partition(partition) == node):
                    answers[partition] = CoordinatorAnswer(
                        found.fate, found.transactional_id, found.transaction_timeout_ms)
        return answers

    async def close(self) -> None:
        """Nothing to release."""


class SimControllerLink:
    """The ControllerLink port (controller_link.GrpcControllerLink)."""

    def __init__(self, net: Network, me: Incarnation, layout: ClusterLayout) -> None:
        self._net = net
        self._me = me
        self._layout = layout

    async def _call(self, what: str, op: Callable[[StoreRuntime], Awaitable[T]]) -> T:
        dst = store_name(self._layout.controller_node_id)
        try:
            return await self._net.call(self._me, dst, what, lambda t: op(serving_store(t)),
                                        timeout_s=CONTROLLER_TIMEOUT_S)
        except (RpcTimeout, RpcUnavailable, ServiceError) as exc:
            raise ServiceError(ErrorCode.LEADER_NOT_AVAILABLE,
                               f"the topic catalog's owner did not answer: {exc}") from None

    async def list_topics(self) -> list[TopicRecord]:
        return await self._call("list-topics",
                                lambda s: s.list_topics(include_internal=True))

    async def create_topics(self, specs: Sequence[TopicSpec], *,
                            validate_only: bool) -> list[TopicOutcome]:
        return await self._call("create-topics",
                                lambda s: s.create_topics(specs, validate_only=validate_only))

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]:
        return await self._call("delete-topics", lambda s: s.delete_topics(names))

    async def create_partitions(self, specs: Sequence[NewPartitions], *,
                                validate_only: bool) -> list[TopicOutcome]:
        return await self._call(
            "create-partitions", lambda s: s.create_partitions(specs, validate_only=validate_only))

    async def notify_catalog_changed(self, node_id: int) -> None:
        """Best effort, as the real link (topics are not deleted here)."""

    def partition_states(self) -> None:
        """Single copies, as the real link of a cluster without etcd."""
        return None

    async def close(self) -> None:
        """Nothing to release."""


class SimLeaderLink:
    """The LeaderLink port (replica_link.GrpcLeaderLink): a follower's
    ReplicaFetch and OffsetsForLeaderEpoch to the leader's store, as
    messages (lost, delayed, cut off, refused by a dead process like any
    other); a transport failure is a ServiceError with the code gRPC's would
    map to, as the real link raises."""

    def __init__(self, net: Network, me: Incarnation) -> None:
        self._net = net
        self._me = me

    async def _call(self, leader: int, what: str, op: Callable[[StoreRuntime], Awaitable[T]],
                    timeout_s: float) -> T:
        try:
            return await self._net.call(self._me, store_name(leader), what,
                                        lambda t: op(serving_store(t)), timeout_s=timeout_s)
        except (RpcTimeout, RpcUnavailable) as exc:
            raise ServiceError(transport_error(exc),
                               f"leader store node {leader}: {exc}") from None

    async def replica_fetch(self, leader: int, replica_id: int,
                            items: Sequence[ReplicaFetchItem], *,
                            max_wait_ms: int, session_id: int = 0, session_epoch: int = 0,
                            forgotten: Sequence[tuple[str, int]] = (),
                            ) -> tuple[int, list[ReplicaFetchOutcome]]:
        async def op(store: StoreRuntime) -> tuple[int, list[ReplicaFetchOutcome]]:
            return await store.replica_fetch_session(
                replica_id, items, session_id=session_id, session_epoch=session_epoch,
                forgotten=forgotten, max_wait_ms=max_wait_ms)

        what = f"replica-fetch s{session_id}/{session_epoch} " + " ".join(
            f"{i.topic}-{i.partition}@{i.fetch_offset}/e{i.current_leader_epoch}" for i in items)
        if forgotten:
            what += " forget " + " ".join(f"{t}-{p}" for t, p in forgotten)
        return await self._call(leader, what, op, REPLICA_RPC_TIMEOUT_S + max_wait_ms / 1000)

    async def offsets_for_leader_epoch(
        self, leader: int, queries: Sequence[tuple[str, int, int, int]],
    ) -> list[EpochEndOutcome]:
        async def op(store: StoreRuntime) -> list[EpochEndOutcome]:
            return store.offsets_for_leader_epoch(queries)

        what = "offsets-for-leader-epoch " + " ".join(
            f"{t}-{p}/e{e}" for t, p, e, _c in queries)
        return await self._call(leader, what, op, REPLICA_RPC_TIMEOUT_S)

    async def partition_states(self, node_id: int) -> dict[tuple[str, int], PartitionState]:
        async def op(store: StoreRuntime) -> dict[tuple[str, int], PartitionState]:
            return store.partition_states()

        return await self._call(node_id, "partition-states", op, PARTITION_STATES_TIMEOUT_S)

    async def close(self) -> None:
        """Nothing to release."""


# ------------------------------------------------------------------ disks


class SimDisk:
    """A store node's disk with an OS page cache: a write lands in the
    cache at once (what the process reads back, what survives kill -9 of
    the process), and reaches the platter at the next writeback (`flush`,
    which the simulation runs every few seconds, as the kernel's flusher
    does; with fsync off nothing else syncs) or at a `sync` (the writer's
    fsync, with --fsync). A machine crash
    (`lose_unsynced`) keeps the synced state plus a prefix of the writes
    after it (a write-ahead log replays in order and stops at its torn
    end); `wipe` is a new, empty disk. The KeyValueStore port, over
    MemoryStores."""

    def __init__(self) -> None:
        self._synced = MemoryStore()
        self._live = MemoryStore()
        self._unsynced: list[WriteGroup] = []
        # Calls of sync() (the writer's fsyncs, with --fsync).
        self.syncs = 0
        # Called once at the next write (then cleared): a machine crash
        # aimed at the moment between a write and its sync.
        self.on_next_write: Callable[[], None] | None = None

    # ------------------------------------------------------------- faults

    @property
    def unsynced_writes(self) -> int:
        return len(self._unsynced)

    def flush(self) -> None:
        """The kernel writes the page cache back: everything is on the platter."""
        for group in self._unsynced:
            self._synced.write(group)
        self._unsynced.clear()

    def lose_unsynced(self, keep: int) -> int:
        """A machine crash: the first `keep` writes since the last writeback
        survive, the rest are gone. Returns how many were lost."""
        kept, lost = self._unsynced[:keep], self._unsynced[keep:]
        self._unsynced = kept
        self.flush()
        self._live = MemoryStore()
        everything = WriteGroup()
        for key, value in self._synced.scan(b"", _KEY_END):
            everything.put(key, value)
        self._live.write(everything)
        return len(lost)

    def wipe(self) -> None:
        """A new, empty disk."""
        self._synced = MemoryStore()
        self._live = MemoryStore()
        self._unsynced = []

    # --------------------------------------------------------------- port

    def write(self, group: WriteGroup) -> None:
        self._live.write(group)
        self._unsynced.append(WriteGroup(list(group.ops)))
        if self.on_next_write is not None:
            armed, self.on_next_write = self.on_next_write, None
            armed()

    def sync(self) -> None:
        """fsync: every write so far is on the platter."""
        self.syncs += 1
        self.flush()

    def get(self, key: bytes) -> bytes | None:
        return self._live.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._live.scan(start, end)

    def seek_for_prev(self, key: bytes, lower_bound: bytes) -> tuple[bytes, bytes] | None:
        return self._live.seek_for_prev(key, lower_bound)

    def locate(self, key: bytes) -> str | None:
        return None

    def room_to_reopen(self) -> bool:
        return True

    def reopen(self) -> None:
        """Writes here never fail: nothing to reopen."""

    def close(self) -> None:
        """The disk outlives the process."""


# Above every key of the store's layout (storage/keys.py: each starts with
# an ASCII letter).
_KEY_END = b"\xff" * 8


__all__ = [
    "FaultProfile", "Hold", "Incarnation", "Network", "RpcTimeout", "RpcUnavailable",
    "SimControllerLink", "SimDisk", "SimLeaderDirectory", "SimLeaderLink", "SimMarkerSender",
    "SimProducerIdLog", "SimStoreClient", "SimTxnLog", "SimTxnResolver", "SimTxnVerifier",
    "coordinator_name", "group_coordinator_name", "serving_store", "store_name", "transport_error",
]
