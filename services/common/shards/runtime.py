"""The machinery both coordinators share (Kafka's coordinator-common
`CoordinatorRuntime`): one runtime that owns internal-topic partitions and,
per partition, a shard — the memory that replaying the partition's records
builds (`TxnPartitionState` for `__transaction_state`,
`OffsetsPartitionState` for `__consumer_offsets`).

What the runtime does for every coordinator:

* **Ownership.** It owns the partitions the layout gives this node, loads
  each in the background (the store may still be starting; retried with
  backoff), and answers NOT_COORDINATOR for a partition it does not own or
  lost, COORDINATOR_LOAD_IN_PROGRESS for one it is loading. Or, for a
  coordinator that runs in every store's process, the partitions its store
  leads (`follow_leaders`): the store tells it (`follow`) when it starts or
  stops leading one, and ownership moves with leadership, as Kafka's
  coordinators move with their partitions' leaders.
* **Load = replay, then claim.** Loading replays the partition from the
  start into a fresh shard, then claims it by appending a coordinator-epoch
  record one above the last (`services/common/shards/coordinator_epoch.py`). A reload
  (after a write whose outcome is unknown) keeps the epoch this process
  claimed, unless it finds a newer one: then another coordinator owns the
  partition and this one is fenced for good.
* **One writer per partition.** Each partition has a lock; a coordinator
  holds it from planning a change until the change is replayed, so its plans
  see every change before them (`append`: one append per change).
* **Or group commit** (Kafka's coordinator runtime; a runtime given
  `copy_shard`). The lock is held only while a change is planned and
  `submit`ted: its records are replayed at once into the partition's
  *pending* shard (the durable shard plus every change not yet durable), so
  the next plan sees them, and queued. One append per partition is in
  flight at a time; the changes submitted while it flies go out together as
  the next one (a batch, bounded by `max_batch_bytes`), and each caller is
  answered once the batch holding its change is durable and replayed into
  the shard itself. The shard (`owned.state`) stays the log's state, what
  answers from memory read. A batch the store refuses whole fails exactly
  its changes and rolls the pending shard back to the durable one; changes
  queued behind it were planned on what was rolled back, so they fail with
  `StalePlan` and their coordinator plans them again. An answer planned
  from pending state without a write of its own waits (`settle`) until what
  it saw is durable.
* **Write = conditional append, then replay.** Records are appended on the
  log end offset this process has replayed up to, so a process that lost the
  partition, or whose earlier write's outcome is unknown, cannot write past
  what it has seen. Only after the append is durable are the records replayed
  into the shard (replay is the only way a shard changes: live traffic and
  recovery run the same code), and only then does the caller answer. A write
  whose outcome is unknown unloads the partition and reloads it from the log,
  the only source of truth.
* **Ownership confirmation.** Before an answer given from memory alone (no
  write proved that memory is the log's state), `confirm_ownership` checks
  that the log still ends where memory does; docs/coordinator.md says why that
  is enough.

What differs between the coordinators is given to the runtime, not copied
into it: the log port (how records are read, appended and handed to replay),
the shard's constructor and replay, what happens when a partition is loaded
or unloaded (markers, session deadlines, a tail task), and whether others
write the log too (`others_write`): the transaction coordinator is the only
writer of `__transaction_state`, so a moved log end there means another
coordinator; `__consumer_offsets` also receives the transaction
coordinators' markers, so a moved log end there is read, replayed and the
write tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from oncelog.wire.errors import ErrorCode

from ..kernel.errors import ServiceError
from ..kernel.invariants import InvariantViolation, invariant
from ..kernel.tasks import TaskGroup
from .coordinator_epoch import encode_epoch

log = logging.getLogger(__name__)

LogEntry = tuple[bytes | None, bytes | None]

# The most record bytes one batched append carries (keys, values and a
# per-record allowance for the batch format), well under the store's
# max.message.bytes (1 MiB by default): a batch of many small changes must not
# be refused as too large when each change alone would pass.
DEFAULT_MAX_BATCH_BYTES = 256 * 1024
RECORD_OVERHEAD_BYTES = 64

# A conditional append that keeps failing because others keep writing (markers
# on __consumer_offsets) is given up after this many catch-ups.
MAX_APPEND_ATTEMPTS = 20
# An append slower than this is logged: while it runs, the partition's lock
# is held (the group coordinator's commits), so everything else on the
# partition waits too, heartbeats included.
SLOW_APPEND_LOG_S = 2.0

R = TypeVar("R")  # what a log hands to replay: one record, or one batch
S = TypeVar("S", bound="Shard")
W = TypeVar("W")  # how a write is stamped (a transactional producer), or nothing
W_contra = TypeVar("W_contra", contravariant=True)


class Shard(Protocol):
    """One partition's memory. It changes only through its coordinator's
    replay of the partition's records; the runtime needs to read the newest
    coordinator epoch replayed."""

    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class LogBatch(Generic[R]):
    """Records to replay, and the offset past them in the log."""

    next_offset: int
    records: Sequence[R]


@dataclass(frozen=True, slots=True)
class LogRead(Generic[R]):
    batches: Sequence[LogBatch[R]]
    # Where the next read starts (past records the store filtered out).
    next_offset: int
    high_watermark: int


class WriteRefused(Exception):
    """Raised by a log's append when the store refused the write whole and
    wrote nothing: memory is still the log's state (no reload), and `error`
    goes to the caller as it is."""

    def __init__(self, error: ServiceError) -> None:
        super().__init__(error.message)
        self.error = error


class StalePlan(ServiceError):
    """A change (or an answer) was planned on pending state that did not
    become durable: its batch, or one before it, failed. Nothing of it was
    written; the coordinator plans it again on the state as it is now. A
    caller that does not replan passes it on as a retriable error."""

    def __init__(self, what: str) -> None:
        super().__init__(ErrorCode.COORDINATOR_NOT_AVAILABLE, what)


@dataclass(eq=False, slots=True)
class _Change:
    """One submitted change: its records, and its caller's answer."""

    entries: Sequence[LogEntry]
    done: asyncio.Future[None]

    @property
    def size_bytes(self) -> int:
        return sum(len(k or b"") + len(v or b"") + RECORD_OVERHEAD_BYTES
                   for k, v in self.entries)


@dataclass(frozen=True, slots=True)
class PlanView(Generic[S]):
    """What a change is planned on: the pending shard (durable state plus
    every change submitted and not yet durable), how many rollbacks the
    partition had seen then, and the answer of the last change submitted
    before (None: nothing was pending). Taken and used under owned.lock."""

    state: S
    rollbacks: int
    tail: asyncio.Future[None] | None


class CoordinatorLog(Protocol[R, W_contra]):
    """The port to one internal topic's partitions."""

    async def read(self, partition: int, from_offset: int, *,
                   max_wait_ms: int = 0) -> LogRead[R]:
        """Records from from_offset on (one read; the runtime loops to the
        high watermark); with max_wait_ms, waits that long for something new."""
        ...

    async def append(self, partition: int, entries: Sequence[LogEntry], *,
                     expected_log_end_offset: int, writer: W_contra | None) -> LogBatch[R]:
        """Appends if the log still ends at expected_log_end_offset (else
        ServiceError LOG_END_OFFSET_MISMATCH); returns what was written, as
        replay takes it. Raises WriteRefused when nothing was written."""
        ...

    async def log_end_offset(self, partition: int) -> int:
        """Where the partition's durable records end now."""
        ...


@dataclass
class OwnedPartition(Generic[S]):
    """A partition this process owns, with its shard. Coordinators subclass
    it for what they keep beside the shard that replay does not build
    (marker tasks, session deadlines)."""

    partition: int
    state: S
    # Where the records replayed into `state` end: the offset every
    # conditional append expects.
    log_end_offset: int = 0
    loaded: bool = False
    # Another coordinator took the partition over: this one must not touch it.
    fenced: bool = False
    # The coordinator epoch this process claimed (-1: not yet).
    my_epoch: int = -1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Ownership confirmations waiting for the next read of the log end (None:
    # nobody waits), and whether the task that runs those reads is alive.
    next_ownership_check: asyncio.Future[None] | None = None
    checking_ownership: bool = False
    # Group commit (see the module docstring). `pending_state`: the shard
    # with every submitted change replayed, None when nothing is pending;
    # `queue`: changes submitted and not yet appended; `in_flight`: the batch
    # being appended; `flushing`: whether the task that appends is running;
    # `idle`: set when nothing is queued or in flight. `rollbacks` counts
    # pending state thrown away (a failed batch, an unload): a plan made
    # before one is stale. `generation` counts unloads, so an append that
    # returns after one does not touch the reloaded shard.
    pending_state: S | None = None
    queue: list[_Change] = field(default_factory=list)
    in_flight: list[_Change] = field(default_factory=list)
    flushing: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    rollbacks: int = 0
    generation: int = 0
    last_submitted: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self.idle.set()


P = TypeVar("P", bound=OwnedPartition[Any])


def _ignore(_owned: Any) -> None:
    return None


class CoordinatorRuntime(Generic[P, S, R, W]):
    """Owns a coordinator's partitions; see the module docstring."""

    def __init__(
        self,
        *,
        topic: str,
        node_id: int,
        kind: str,
        partitions: Iterable[int],
        log: CoordinatorLog[R, W],
        new_partition: Callable[[int], P],
        new_shard: Callable[[], S],
        replay: Callable[[S, R], None],
        others_write: bool,
        tail_wait_ms: int = 1000,
        on_loaded: Callable[[P], None] = _ignore,
        on_unloaded: Callable[[P], None] = _ignore,
        copy_shard: Callable[[S], S] | None = None,
        replay_entry: Callable[[S, LogEntry], None] | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        on_batch: Callable[[int, int, float], None] | None = None,
        follow_leaders: bool = False,
    ) -> None:
        """`kind` names this coordinator in errors ("coordinator", "group
        coordinator"); `replay` applies one record to a shard; `on_loaded`
        runs under the partition's lock once it is loaded, `on_unloaded` when
        its memory is dropped for a reload. With `others_write`, a moved log end
        is caught up and the write retried, and a tail task follows each loaded
        partition (long polls of `tail_wait_ms`).

        With `copy_shard` (and `replay_entry`, which replays one submitted
        record into a pending shard), changes may be `submit`ted for group
        commit; only for a log nobody else writes (a moved log end there is
        another coordinator, never something to catch up with and retry).
        `on_batch(changes, records, seconds)` observes each batch appended.

        With `follow_leaders`, `partitions` are every partition of the
        topic, none owned until `follow` says this process's store leads it."""
        invariant((copy_shard is None) == (replay_entry is None),
                  "group commit needs both copy_shard and replay_entry")
        invariant(copy_shard is None or not others_write,
                  lambda: f"{topic}: group commit on a log others write")
        self.topic = topic
        self.node_id = node_id
        self.kind = kind
        self._log = log
        self._new_shard = new_shard
        self._replay = replay
        self._others_write = others_write
        self._tail_wait_ms = tail_wait_ms
        self._on_loaded = on_loaded
        self._on_unloaded = on_unloaded
        self._copy_shard = copy_shard
        self._replay_entry = replay_entry
        self._max_batch_bytes = max_batch_bytes
        self._on_batch = on_batch
        self._new_partition = new_partition
        self.partitions: dict[int, P] = {p: new_partition(p) for p in partitions}
        self.follow_leaders = follow_leaders
        # Following leaders: the leader epoch at which each partition was
        # taken over (a new one means another store may have led it since).
        self._taken_at_epoch: dict[int, int] = {}
        if follow_leaders:
            for owned in self.partitions.values():
                owned.fenced = True  # not ours until its store leads it
        self.tasks = TaskGroup()
        self.stopping = False

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Loads every owned partition in the background."""
        for owned in self.partitions.values():
            self.spawn(self._load_until_done(owned))

    async def stop(self, extra: Iterable[asyncio.Task[None]] = ()) -> None:
        self.stopping = True
        await self.tasks.stop(extra)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.spawn(coro)

    def follow(self, partition: int, *, leads: bool, leader_epoch: int) -> None:
        """Following leaders: this process's store leads `partition` at
        `leader_epoch`, or does not lead it. A partition its store now leads
        is taken over: a fresh load, whose coordinator-epoch claim fences
        the previous owner (the store that led it before, if still alive,
        can no longer append to it anyway). One it stopped leading is let go
        at once: its requests answer NOT_COORDINATOR, and the client finds
        the new owner. A new leader epoch with this store still leading is
        taken over afresh too: another store may have led the partition in
        between, and written to it."""
        if not self.follow_leaders or partition not in self.partitions or self.stopping:
            return
        current = self.partitions[partition]
        if leads and not current.fenced and self._taken_at_epoch.get(partition) == leader_epoch:
            return
        if not current.fenced:
            log.info("%s-%d: %s; %s %d lets it go", self.topic, partition,
                     f"this store leads it anew at leader epoch {leader_epoch}" if leads
                     else "this store no longer leads it", self.kind, self.node_id)
            current.fenced = True
            current.loaded = False
            self._drop_pending(current, f"{self.topic}-{partition} moved with its leadership")
            self._on_unloaded(current)
        if leads:
            fresh = self._new_partition(partition)
            self.partitions[partition] = fresh
            self._taken_at_epoch[partition] = leader_epoch
            self.spawn(self._load_until_done(fresh))
        else:
            self._taken_at_epoch.pop(partition, None)

    def assigned(self, partition: int) -> bool:
        """Whether the partition is this coordinator's to own: the layout's
        (every partition it holds), or, following leaders, one its store
        leads. What its metrics count: a partition another store leads is
        not "fenced" here, only not this coordinator's."""
        return not self.follow_leaders or partition in self._taken_at_epoch

    async def _load_until_done(self, owned: P) -> None:
        backoff_s = 0.05
        while not self.stopping and not owned.loaded and not owned.fenced:
            try:
                async with owned.lock:
                    await self._load(owned)
            except ServiceError as exc:
                log.info("loading %s-%d: %s; retrying", self.topic, owned.partition, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
        if self._others_write and owned.loaded and not self.stopping:
            self.spawn(self._tail(owned))

    async def _load(self, owned: P) -> None:
        """Replays the partition from the start, then claims it with a higher
        coordinator epoch (a reload after an uncertain write keeps the epoch
        this process claimed, unless a newer owner exists: then it is fenced)."""
        owned.state = self._new_shard()
        owned.log_end_offset = 0
        await self._catch_up(owned)
        if owned.my_epoch >= 0:
            if owned.state.coordinator_epoch > owned.my_epoch:
                self._fence(owned)
                return
            if owned.state.coordinator_epoch < owned.my_epoch:
                # Our own epoch record was acknowledged, so a read that does
                # not show it is behind (a leader rebuilt after a full disk,
                # or newly elected, whose high watermark has not caught up
                # yet), not a newer owner: fencing here would leave the
                # partition unserved for good. Read again.
                raise ServiceError(
                    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                    f"{self.topic}-{owned.partition}: the log read up to offset "
                    f"{owned.log_end_offset} shows coordinator epoch "
                    f"{owned.state.coordinator_epoch}, expected this coordinator's "
                    f"{owned.my_epoch}: the read is behind; reloading again")
        else:
            record = encode_epoch(owned.state.coordinator_epoch + 1, self.node_id)
            try:
                written = await self._log.append(
                    owned.partition, [record], expected_log_end_offset=owned.log_end_offset,
                    writer=None,
                )
            except ServiceError as exc:
                if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH:
                    raise ServiceError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                       "the log moved while loading") from exc
                raise
            self._apply(owned, written)
            owned.my_epoch = owned.state.coordinator_epoch
        if owned.fenced:
            return  # let go while it loaded (follow)
        owned.loaded = True
        log.info("loaded %s-%d: coordinator epoch %d", self.topic, owned.partition,
                 owned.my_epoch)
        self._on_loaded(owned)

    def _fence(self, owned: P) -> None:
        log.warning("%s-%d: coordinator epoch %d superseded by %d; this coordinator is fenced",
                    self.topic, owned.partition, owned.my_epoch, owned.state.coordinator_epoch)
        owned.fenced = True
        owned.loaded = False

    def fence(self, owned: P) -> None:
        """Another coordinator owns the partition (a store said so): this one
        must not touch it again."""
        owned.fenced = True

    def unload(self, owned: P) -> None:
        """Forgets memory that may be behind the log; a reload follows.
        Changes still pending fail (they are planned again, and find the
        partition loading)."""
        owned.loaded = False
        self._drop_pending(owned, f"{self.topic}-{owned.partition} is reloading")
        self._on_unloaded(owned)
        self.spawn(self._load_until_done(owned))

    # ------------------------------------------------------------ log access

    def _apply(self, owned: P, batch: LogBatch[R]) -> None:
        for record in batch.records:
            self._replay(owned.state, record)
        owned.log_end_offset = batch.next_offset

    def apply_read(self, owned: P, read: LogRead[R]) -> None:
        """Replays the read's batches not yet replayed, in order (a read made
        without the lock may return our own writes since)."""
        for batch in read.batches:
            if batch.next_offset <= owned.log_end_offset:
                continue  # ours, or already replayed
            self._apply(owned, batch)
        owned.log_end_offset = max(owned.log_end_offset, read.next_offset)

    async def _catch_up(self, owned: P) -> None:
        """Reads and replays from where memory ends up to the high watermark."""
        while True:
            read = await self._log.read(owned.partition, owned.log_end_offset)
            before = owned.log_end_offset
            self.apply_read(owned, read)
            if owned.log_end_offset >= read.high_watermark or owned.log_end_offset == before:
                return

    async def _tail(self, owned: P) -> None:
        """Follows a partition others write too, so their records (markers)
        are replayed soon after they land, without waiting for our next write."""
        backoff_s = 0.05
        while not self.stopping and owned.loaded and not owned.fenced:
            try:
                read = await self._log.read(owned.partition, owned.log_end_offset,
                                            max_wait_ms=self._tail_wait_ms)
                backoff_s = 0.05
            except ServiceError as exc:
                log.debug("tailing %s-%d: %s", self.topic, owned.partition, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            async with owned.lock:
                if owned.loaded and not owned.fenced:
                    self.apply_read(owned, read)
                    if owned.state.coordinator_epoch != owned.my_epoch:
                        self._fence(owned)

    async def _catch_up_or_unload(self, owned: P) -> None:
        try:
            await self._catch_up(owned)
        except ServiceError as exc:
            self.unload(owned)
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               f"catching up {self.topic}-{owned.partition}: "
                               f"{exc.message}") from exc
        self.check_epoch(owned)

    def check_epoch(self, owned: P) -> None:
        """After replaying others' records: a newer coordinator-epoch record
        among them means another process took the partition over."""
        if owned.state.coordinator_epoch != owned.my_epoch:
            self._fence(owned)
            raise ServiceError(ErrorCode.NOT_COORDINATOR,
                               f"{self.topic}-{owned.partition} has a newer owner")

    async def append(self, owned: P, entries: Sequence[LogEntry], *,
                     writer: Callable[[S], W] | None = None) -> None:
        """Appends records, then replays them; the caller holds owned.lock.
        `writer` stamps the write (a transactional producer), built from the
        shard: again after a catch-up, since a marker read then may change
        what it must be (the next sequence). Submitted changes go first."""
        await self.drain(owned)
        self.check_loaded(owned)
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            started_s = time.monotonic()
            try:
                written = await self._log.append(
                    owned.partition, entries, expected_log_end_offset=owned.log_end_offset,
                    writer=writer(owned.state) if writer is not None else None,
                )
            except WriteRefused as refused:
                self._log_slow_append(owned, started_s, refused.error.code.name)
                raise refused.error from refused
            except ServiceError as exc:
                self._log_slow_append(owned, started_s, f"{exc.code.name}: {exc.message}")
                if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH and self._others_write:
                    # A marker (or a newer owner) moved the log: read it and retry.
                    await self._catch_up_or_unload(owned)
                    continue
                # The outcome is unknown (a lost reply) or the log moved under
                # us (a newer coordinator): memory may be behind the log. Reload.
                self.unload(owned)
                code = (ErrorCode.NOT_COORDINATOR if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH
                        else ErrorCode.COORDINATOR_NOT_AVAILABLE)
                raise ServiceError(
                    code, f"{self.topic}-{owned.partition} write failed: {exc.message}"
                ) from exc
            self._log_slow_append(owned, started_s, "written")
            self._apply(owned, written)
            return
        raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                           f"{self.topic}-{owned.partition}: the log kept moving")

    def _log_slow_append(self, owned: P, started_s: float, outcome: str) -> None:
        took_s = time.monotonic() - started_s
        if took_s >= SLOW_APPEND_LOG_S:
            log.warning("%s-%d: an append took %.1f s (%s)", self.topic, owned.partition,
                        took_s, outcome)

    # ---------------------------------------------------------- group commit

    def view(self, owned: P) -> PlanView[S]:
        """What a change is planned on; the caller holds owned.lock."""
        state = owned.pending_state if owned.pending_state is not None else owned.state
        return PlanView(state, owned.rollbacks, owned.last_submitted)

    def submit(self, owned: P, entries: Sequence[LogEntry],
               view: PlanView[S]) -> asyncio.Future[None]:
        """Queues a change planned on `view` for the next batch and replays it
        into the pending shard (the next plan sees it); the caller holds
        owned.lock and awaits the answer (`settle`) after releasing it. The
        answer: None once the change is durable and replayed; its batch's
        error if that failed; StalePlan if something it was planned on did
        not become durable."""
        copy_shard, replay_entry = self._copy_shard, self._replay_entry
        if copy_shard is None or replay_entry is None:
            raise InvariantViolation(f"{self.topic}: submit without group commit")
        self.check_loaded(owned)
        if view.rollbacks != owned.rollbacks:
            raise StalePlan(f"{self.topic}-{owned.partition}: planned on pending changes "
                            "that failed")
        if owned.pending_state is None:
            owned.pending_state = copy_shard(owned.state)
        for entry in entries:
            replay_entry(owned.pending_state, entry)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # An answer whose caller went away leaves its exception unread.
        done.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        owned.queue.append(_Change(entries, done))
        owned.last_submitted = done
        if not owned.flushing:
            owned.flushing = True
            owned.idle.clear()
            self.spawn(self._flush(owned, owned.generation))
        return done

    async def settle(self, owned: P, view: PlanView[S],
                     done: asyncio.Future[None] | None = None) -> None:
        """Waits for a change's answer (`done`, from submit) or, for an
        answer planned without a write, until every change it saw is durable:
        StalePlan if one of them failed. Called without owned.lock."""
        if done is not None:
            await asyncio.shield(done)
            return
        if view.tail is not None:
            try:
                await asyncio.shield(view.tail)
            except ServiceError as exc:
                raise StalePlan(f"{self.topic}-{owned.partition}: planned on a change that "
                                f"failed ({exc.message})") from exc

    async def drain(self, owned: P) -> None:
        """Returns once no submitted change is queued or in flight; the
        caller holds owned.lock, so none can be submitted meanwhile."""
        while not owned.idle.is_set():
            await owned.idle.wait()

    def _take_batch(self, owned: P) -> list[_Change]:
        """The queued changes the next append carries: in order, as many as
        fit in max_batch_bytes (at least one)."""
        taken, size = 0, 0
        for change in owned.queue:
            size += change.size_bytes
            if taken and size > self._max_batch_bytes:
                break
            taken += 1
        batch, owned.queue = owned.queue[:taken], owned.queue[taken:]
        return batch

    async def _flush(self, owned: P, generation: int) -> None:
        """Appends the queued changes, a batch at a time, until none is
        queued: the partition's only writer while changes are pending."""
        try:
            while owned.queue and owned.generation == generation:
                batch = owned.in_flight = self._take_batch(owned)
                entries = [entry for change in batch for entry in change.entries]
                started_s = time.perf_counter()
                try:
                    written = await self._log.append(
                        owned.partition, entries,
                        expected_log_end_offset=owned.log_end_offset, writer=None)
                except WriteRefused as refused:
                    if owned.generation != generation:
                        return  # unloaded meanwhile: its changes were answered
                    # Nothing was written: memory is still the log's state.
                    owned.in_flight = []
                    _fail(batch, refused.error)
                    self._roll_back(owned, f"{self.topic}-{owned.partition}: a batch before "
                                           f"this change was refused ({refused.error.message})")
                    continue
                except ServiceError as exc:
                    if owned.generation != generation:
                        return
                    owned.in_flight = []
                    _fail(batch, self._write_failed(owned, exc))
                    self.unload(owned)
                    return
                if owned.generation != generation:
                    return
                self._apply(owned, written)
                owned.in_flight = []
                if not owned.queue:
                    owned.pending_state = None  # the shard has caught up with it
                for change in batch:
                    if not change.done.done():
                        change.done.set_result(None)
                if self._on_batch is not None:
                    self._on_batch(len(batch), len(entries), time.perf_counter() - started_s)
        except BaseException:
            # Stopped (or a bug): nobody will append what is pending.
            if owned.generation == generation:
                self._drop_pending(owned, f"{self.topic}-{owned.partition}: {self.kind} "
                                          f"{self.node_id} is stopping")
            raise
        finally:
            if owned.generation == generation:
                owned.flushing = False
                owned.idle.set()

    def _write_failed(self, owned: P, exc: ServiceError) -> ServiceError:
        """The error a write whose outcome is unknown, or that found the log
        moved (a newer coordinator), answers; the partition reloads."""
        code = (ErrorCode.NOT_COORDINATOR if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH
                else ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return ServiceError(code, f"{self.topic}-{owned.partition} write failed: {exc.message}")

    def _roll_back(self, owned: P, why: str) -> None:
        """Throws the pending state away: what is queued was planned on it."""
        queued, owned.queue = owned.queue, []
        owned.pending_state = None
        owned.rollbacks += 1
        _fail(queued, StalePlan(why))

    def _drop_pending(self, owned: P, why: str) -> None:
        """Memory is being dropped: every pending change fails (the batch in
        flight retriably: its outcome is for the reload to find)."""
        in_flight, owned.in_flight = owned.in_flight, []
        _fail(in_flight, ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE, why))
        self._roll_back(owned, why)
        owned.generation += 1
        owned.flushing = False
        owned.idle.set()

    # ------------------------------------------------------------- ownership

    def owned(self, partition: int, what: str) -> P:
        """The loaded partition a request for `what` (e.g. "group 'g'") goes
        to, or NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS."""
        owned = self.partitions.get(partition)
        if owned is None or owned.fenced:
            raise ServiceError(
                ErrorCode.NOT_COORDINATOR,
                f"{what} belongs to {self.topic}-{partition}, which {self.kind} "
                f"{self.node_id} does not own",
            )
        self.check_loaded(owned)
        return owned

    def check_loaded(self, owned: P) -> None:
        if not owned.loaded:
            raise ServiceError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"{self.topic}-{owned.partition} is loading",
            )

    def loading(self) -> list[int]:
        """The partitions this coordinator owns and has not loaded yet (a
        start, a takeover, or a reload after an uncertain write)."""
        return sorted(p for p, owned in self.partitions.items()
                      if not owned.fenced and not owned.loaded)

    def serving_whole(self, what: str) -> list[P]:
        """serving(), for a listing (`what`) that must be whole, as Kafka's
        ListTransactions and ListGroups are: COORDINATOR_LOAD_IN_PROGRESS
        (retriable) while any partition it owns is loading, instead of a
        listing that silently leaves that partition's entries out."""
        loading = self.loading()
        if loading:
            raise ServiceError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"{what}: {self.topic} partition(s) {', '.join(map(str, loading))} "
                f"of {self.kind} {self.node_id} are loading",
            )
        return list(self.serving())

    def serving(self) -> Iterator[P]:
        """The partitions loaded and not fenced: what information requests
        and timers walk. Lazy, so a walk that awaits skips a partition
        unloaded or fenced meanwhile."""
        return (o for o in self.partitions.values() if o.loaded and not o.fenced)

    async def confirm_ownership(self, owned: P) -> None:
        """Returns once a read of the partition's log end that started after
        this call found the log ending where this coordinator's memory ends:
        nobody else has written it, so memory was the log's state at that read.

        Concurrent callers share one read (one that starts after the last of
        them arrived: a read already in flight may have been answered before
        they came), so under load a batch of verifications costs one store
        round trip, not one each. Raises NOT_COORDINATOR when another
        coordinator has written the log (this one reloads, and the reload
        finds it fenced), a retriable error when the store cannot be asked."""
        waiter = owned.next_ownership_check
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            # A waiter whose caller went away leaves its exception unread.
            waiter.add_done_callback(
                lambda f: None if f.cancelled() else f.exception())
            owned.next_ownership_check = waiter
            if not owned.checking_ownership:
                owned.checking_ownership = True
                self.spawn(self._run_ownership_checks(owned))
        await asyncio.shield(waiter)

    async def _run_ownership_checks(self, owned: P) -> None:
        """Answers the waiting confirmations with one read each round, until
        none is waiting."""
        try:
            while owned.next_ownership_check is not None:
                waiter, owned.next_ownership_check = owned.next_ownership_check, None
                try:
                    await self._check_log_end(owned)
                except ServiceError as exc:
                    waiter.set_exception(exc)
                except BaseException:
                    waiter.cancel()
                    raise
                else:
                    waiter.set_result(None)
        finally:
            owned.checking_ownership = False
            if owned.next_ownership_check is not None:  # stopped with callers waiting
                owned.next_ownership_check.cancel()
                owned.next_ownership_check = None

    async def _check_log_end(self, owned: P) -> None:
        if await self._read_log_end(owned) == owned.log_end_offset:
            return
        # Our own write may have landed without its answer having come back
        # yet (or have come back after the read): look again once no write
        # of ours is in flight.
        async with owned.lock:
            self.check_loaded(owned)
            await self.check_log_end_locked(owned)

    async def check_log_end_locked(self, owned: P) -> None:
        """With owned.lock held (once the submitted changes are durable, no
        write of ours is in flight): the log must end where memory does, else
        another coordinator has written it: reload and answer NOT_COORDINATOR."""
        await self.drain(owned)
        self.check_loaded(owned)
        log_end = await self._read_log_end(owned)
        if log_end == owned.log_end_offset:
            return
        log.warning("%s-%d ends at %d, this coordinator's memory at %d: another coordinator "
                    "has written it; reloading", self.topic, owned.partition, log_end,
                    owned.log_end_offset)
        self.unload(owned)
        raise ServiceError(
            ErrorCode.NOT_COORDINATOR,
            f"{self.topic}-{owned.partition} was written by another {self.kind} "
            f"(it ends at {log_end}, {self.kind} {self.node_id} knows it up to "
            f"{owned.log_end_offset})",
        )

    async def _read_log_end(self, owned: P) -> int:
        try:
            return await self._log.log_end_offset(owned.partition)
        except ServiceError as exc:
            raise ServiceError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"cannot confirm that {self.kind} {self.node_id} still owns "
                f"{self.topic}-{owned.partition}: {exc.message}",
            ) from exc


def _fail(changes: Iterable[_Change], error: ServiceError) -> None:
    for change in changes:
        if not change.done.done():
            change.done.set_exception(error)
