"""The metadata store: where the cluster's metadata lives, as a port.

All cluster metadata (the topic catalog; per partition its replicas, leader,
leader epoch and ISR; store registrations held by leases; the controller,
elected through a lease) lives in etcd. A controller and a store need only
what `MetadataStore` offers: point and prefix reads that say at which
revision they were made, one atomic transaction guarded by the mod revisions
the caller read (so of two writers that read the same revision exactly one
wins), leases, and a watch. Keys and values are `str` (UTF-8 in etcd); what a
value means (JSON, usually) is the caller's business.

Two adapters:

* `services.common.metadata.etcd.EtcdMetadataStore`: etcd v3 over gRPC.
* `MemoryMetadataStore` (here): the same semantics in memory, for in-process
  tests and the deterministic simulation. A global revision counter; leases
  expire by the injected clock, checked on every call and by
  `expire_leases()`; deterministic, no threads, no clock of its own.

Semantics both keep (tests/integration/test_metadata_store.py runs the same
contract tests against both):

* The store's revision starts at 1 and goes up by one for each transaction
  that changes something (a put, or a delete of a key that exists), and for
  each expired or revoked lease that held keys. A key's mod revision is the
  revision that last wrote it. A transaction that changes nothing (only
  deletes of absent keys) succeeds without a new revision.
* `commit(compares, puts, deletes)`: if every `Compare(key, mod_revision)`
  holds (0: the key does not exist), the puts and deletes happen at one new
  revision and it returns True; else nothing changes and it returns False.
  A put names a lease or none; a put replaces the key's lease. A put naming a
  lease that no longer exists raises `LeaseNotFound` (when the compares
  hold; nothing changes). At most METADATA_TXN_OPS_MAX compares, and as many
  puts and deletes together; a key at most once among puts and deletes
  (etcd refuses a transaction that writes a key twice): else ValueError.
* Leases: `grant_lease(ttl_s)` returns an id (never 0); keys put with it
  vanish together, at one revision, when it expires (no keep-alive for ttl_s)
  or is revoked. `keep_alive` returns False once the lease is gone. etcd
  raises a TTL below its minimum (1.5 election timeouts, rounded up to whole
  seconds) to that minimum and checks expiry about every 500 ms, so a lease
  there lives from ttl_s to about ttl_s + 0.5 s, measured; the memory
  adapter expires it exactly at its deadline, at the first call after it.
* Watch: a real etcd watch (not polling). Tested against etcd 3.4 it
  delivers every put and delete in revision order, the events of one
  transaction together, and resumes from the next revision after a member
  dies, at once, or stops answering, after about 15 s (the adapter
  reconnects to another member; nothing is lost or repeated:
  tests/integration/test_etcd_cluster.py).
  `watch_prefix(prefix, start_revision=r)` yields lists of events with
  revisions >= r, in order; a list holds whole revisions (all events of
  one transaction, or of one lease expiry, arrive in one list). The usual
  use: `entries, rev = await get_prefix(p)`, then
  `watch_prefix(p, start_revision=rev + 1)`. It raises `WatchCompacted` when
  the revisions from r on are no longer kept (re-read, then watch from the
  new revision), and ends when the store is closed. Close it with
  `contextlib.aclosing` (or `aclose()`) when you stop iterating early.

Errors: every call raises `MetadataUnavailable` (naming the endpoints it
tried) when the store cannot be reached within its timeout; callers map it
to our error codes (a controller or store that cannot reach its metadata is
"not available", a retriable condition). When a `commit` fails after it was
sent, the write may or may not have happened (`maybe_applied`): the caller
re-reads before it decides anything, which the guarded-by-revision design
makes safe. Invalid arguments (an empty key, too many operations, a key
written twice) raise ValueError in both adapters alike.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..kernel.invariants import invariant

# The most compares, and the most puts and deletes together, in one
# transaction: etcd's default --max-txn-ops, which it enforces on the
# server; the memory adapter enforces the same so a test that passes in
# memory does not fail against etcd.
METADATA_TXN_OPS_MAX = 128
# The memory adapter keeps this many of the latest revisions' events for
# watches that start in the past (etcd keeps history until it is compacted:
# `oncelog_local.etcd` compacts to the latest 100 000 revisions); an older start
# raises WatchCompacted, as etcd does.
MEMORY_WATCH_HISTORY_REVISIONS_MAX = 10_000
# The most events the memory adapter puts in one watch list (a revision is
# never split, so one with more events comes whole). etcd batches by its own
# rules, also in whole revisions.
MEMORY_WATCH_BATCH_EVENTS_MAX = 1000

invariant(METADATA_TXN_OPS_MAX <= MEMORY_WATCH_BATCH_EVENTS_MAX,
          "a watch list must hold a whole transaction")


@dataclass(frozen=True, slots=True)
class Versioned:
    """A key's value and the revision that last wrote it."""

    value: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Compare:
    """Holds when the key's mod revision equals mod_revision (0: the key
    does not exist)."""

    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: str
    # The lease the key lives and dies with; None: none (a put replaces the
    # key's lease, as in etcd).
    lease: int | None = None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: str
    # None: the key was deleted (by a commit, or with its lease).
    value: str | None
    mod_revision: int


class MetadataUnavailable(Exception):
    """The metadata store could not be reached (or could not serve) within
    the call's timeout. The message names the endpoints tried.

    maybe_applied: a commit that was sent and then failed may have happened
    (its reply was lost); re-read before deciding. False when nothing was
    applied for sure, and for every call that writes nothing."""

    def __init__(self, message: str, *, endpoints: Sequence[str],
                 maybe_applied: bool = False) -> None:
        super().__init__(message)
        self.endpoints = tuple(endpoints)
        self.maybe_applied = maybe_applied


class LeaseNotFound(Exception):
    """A put named a lease that has expired or was revoked (nothing changed):
    grant a new lease and write again."""

    def __init__(self, lease_ids: Iterable[int]) -> None:
        self.lease_ids = tuple(sorted(set(lease_ids)))
        super().__init__(f"lease {', '.join(map(str, self.lease_ids))} not found: "
                         f"expired or revoked")


class WatchCompacted(Exception):
    """A watch asked for revisions that are no longer kept: read again
    (get_prefix) and watch from the revision after that read."""

    def __init__(self, start_revision: int, compact_revision: int) -> None:
        self.start_revision = start_revision
        self.compact_revision = compact_revision
        super().__init__(f"watch from revision {start_revision}: revisions below "
                         f"{compact_revision} are compacted")


class MetadataStore(Protocol):
    async def get(self, key: str) -> Versioned | None:
        """The key's value and mod revision; None when it does not exist."""
        ...

    async def get_prefix(self, prefix: str) -> tuple[dict[str, Versioned], int]:
        """Every key starting with prefix ("": all), sorted by key, and the
        store revision they were read at (one consistent snapshot)."""
        ...

    async def commit(self, compares: Sequence[Compare], puts: Sequence[Put],
                     deletes: Sequence[str]) -> bool:
        """One atomic transaction: if every compare holds, apply the puts and
        deletes and return True; else change nothing and return False."""
        ...

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease that lives ttl_s seconds without keep-alive (etcd may
        raise ttl_s to its minimum); its id, never 0."""
        ...

    async def keep_alive(self, lease_id: int) -> bool:
        """Restarts the lease's TTL; False when the lease is gone."""
        ...

    async def revoke(self, lease_id: int) -> None:
        """Ends the lease now; its keys vanish. A lease that is gone already
        is not an error."""
        ...

    def watch_prefix(self, prefix: str, *,
                     start_revision: int) -> AsyncGenerator[list[WatchEvent], None]:
        """The events of keys starting with prefix from start_revision on, in
        lists of whole revisions; ends when the store is closed."""
        ...

    async def close(self) -> None:
        """Ends every watch; later calls raise MetadataUnavailable."""
        ...


# ------------------------------------------------------------------ checks


def check_key(key: str, what: str = "key") -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what} {key!r}: a metadata key is a non-empty str")


def check_txn(compares: Sequence[Compare], puts: Sequence[Put],
              deletes: Sequence[str]) -> None:
    """The rules both adapters apply before anything is sent or changed
    (etcd's own checks, so both adapters refuse the same transactions)."""
    if len(compares) > METADATA_TXN_OPS_MAX:
        raise ValueError(f"{len(compares)} compares in one transaction; at most "
                         f"{METADATA_TXN_OPS_MAX}")
    if len(puts) + len(deletes) > METADATA_TXN_OPS_MAX:
        raise ValueError(f"{len(puts)} puts and {len(deletes)} deletes in one "
                         f"transaction; at most {METADATA_TXN_OPS_MAX} together")
    for compare in compares:
        check_key(compare.key, "compare key")
        if compare.mod_revision < 0:
            raise ValueError(f"compare on {compare.key!r}: mod_revision "
                             f"{compare.mod_revision}; expected >= 0 (0: absent)")
    seen: set[str] = set()
    for key in itertools.chain((put.key for put in puts), deletes):
        check_key(key)
        if key in seen:
            raise ValueError(f"key {key!r} written twice in one transaction")
        seen.add(key)
    for put in puts:
        if not isinstance(put.value, str):
            raise ValueError(f"put {put.key!r}: the value is a str, got "
                             f"{type(put.value).__name__}")
        if put.lease is not None and put.lease <= 0:
            raise ValueError(f"put {put.key!r}: lease {put.lease}; expected a "
                             f"granted lease id (> 0) or None")


def check_ttl(ttl_s: int) -> None:
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 1:
        raise ValueError(f"lease ttl_s {ttl_s!r}; expected an int >= 1")


def check_start_revision(start_revision: int) -> None:
    if isinstance(start_revision, bool) or not isinstance(start_revision, int) \
            or start_revision < 1:
        raise ValueError(f"watch start_revision {start_revision!r}; expected an int "
                         f">= 1 (the revision of a read + 1)")


# ------------------------------------------------------------------ memory


@dataclass(slots=True)
class _Entry:
    value: str
    mod_revision: int
    lease: int | None


@dataclass(slots=True)
class _Lease:
    ttl_ms: int
    expires_at_ms: int
    keys: set[str] = field(default_factory=set)


class _MemoryState:
    """What every client of one MemoryMetadataStore shares (etcd's server)."""

    def __init__(self, clock_ms: Callable[[], int], history_revisions_max: int) -> None:
        if history_revisions_max < 1:
            raise ValueError(f"history_revisions_max {history_revisions_max}; expected >= 1")
        self.clock_ms = clock_ms
        self.history_revisions_max = history_revisions_max
        self.revision = 1
        self.entries: dict[str, _Entry] = {}
        self.leases: dict[int, _Lease] = {}
        self.next_lease_id = 1
        # (revision, its events), oldest first; revisions below
        # compact_revision are gone.
        self.history: deque[tuple[int, list[WatchEvent]]] = deque()
        self.compact_revision = 1
        self.waiters: set[asyncio.Future[None]] = set()

    def expire_due(self) -> None:
        now_ms = self.clock_ms()
        due = sorted((lease.expires_at_ms, lease_id)
                     for lease_id, lease in self.leases.items()
                     if lease.expires_at_ms <= now_ms)
        for _, lease_id in due:
            self.end_lease(lease_id)

    def end_lease(self, lease_id: int) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None and lease.keys:
            self.apply([], sorted(lease.keys))

    def apply(self, puts: Sequence[Put], deletes: Sequence[str]) -> None:
        """Puts and deletes at one new revision (none if nothing changes)."""
        deleted = [key for key in deletes if key in self.entries]
        if not puts and not deleted:
            return
        self.revision += 1
        events: list[WatchEvent] = []
        for put in puts:
            self._detach(put.key)
            self.entries[put.key] = _Entry(put.value, self.revision, put.lease)
            if put.lease is not None:
                self.leases[put.lease].keys.add(put.key)
            events.append(WatchEvent(put.key, put.value, self.revision))
        for key in deleted:
            self._detach(key)
            del self.entries[key]
            events.append(WatchEvent(key, None, self.revision))
        self.history.append((self.revision, events))
        while len(self.history) > self.history_revisions_max:
            dropped, _ = self.history.popleft()
            self.compact_revision = dropped + 1
        self.wake()

    def _detach(self, key: str) -> None:
        entry = self.entries.get(key)
        if entry is not None and entry.lease is not None and entry.lease in self.leases:
            self.leases[entry.lease].keys.discard(key)

    def events_since(self, prefix: str, start_revision: int) -> tuple[list[WatchEvent], int]:
        """Events of keys under prefix with revisions >= start_revision, whole
        revisions, at most MEMORY_WATCH_BATCH_EVENTS_MAX events unless one
        revision has more; and the revision to go on from."""
        first = len(self.history)
        while first > 0 and self.history[first - 1][0] >= start_revision:
            first -= 1
        events: list[WatchEvent] = []
        next_revision = max(start_revision, self.revision + 1)
        for index in range(first, len(self.history)):
            revision, revision_events = self.history[index]
            matching = [event for event in revision_events if event.key.startswith(prefix)]
            if events and len(events) + len(matching) > MEMORY_WATCH_BATCH_EVENTS_MAX:
                next_revision = revision
                break
            events.extend(matching)
        return events, next_revision

    def wake(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()


class MemoryMetadataStore:
    """The metadata store in memory, with etcd's semantics (module docstring).

    `another_client()` gives a second client of the same data (two nodes,
    two writers), with its own close() and availability switch.

    Test and simulation hooks:
    * `expire_leases()` ends every lease past its deadline now (every call
      does that first anyway).
    * `set_available(False)`: every call of this client raises
      MetadataUnavailable and its watches raise it (a node cut off from etcd).
    * `fail_next_commits`: the next commits of this client raise
      MetadataUnavailable, after (True: the reply was lost,
      maybe_applied=True) or before (False) the transaction ran.
    """

    ENDPOINTS = ("memory",)

    def __init__(self, *, clock_ms: Callable[[], int],
                 history_revisions_max: int = MEMORY_WATCH_HISTORY_REVISIONS_MAX) -> None:
        self._attach(_MemoryState(clock_ms, history_revisions_max))

    def _attach(self, state: _MemoryState) -> None:
        self._state = state
        self._available = True
        self._closed = False
        self._waiters: set[asyncio.Future[None]] = set()
        self.fail_next_commits: list[bool] = []

    def another_client(self) -> MemoryMetadataStore:
        client = object.__new__(MemoryMetadataStore)
        client._attach(self._state)
        return client

    # --------------------------------------------------------------- hooks

    @property
    def revision(self) -> int:
        return self._state.revision

    def expire_leases(self) -> None:
        self._state.expire_due()

    def set_available(self, available: bool) -> None:
        self._available = available
        self._wake_own()

    # ---------------------------------------------------------------- port

    def _enter(self, what: str) -> _MemoryState:
        if self._closed:
            raise MetadataUnavailable(f"{what}: the metadata store client is closed",
                                      endpoints=self.ENDPOINTS)
        if not self._available:
            raise MetadataUnavailable(f"{what}: metadata store at memory is unavailable "
                                      f"(set_available(False))", endpoints=self.ENDPOINTS)
        self._state.expire_due()
        return self._state

    async def get(self, key: str) -> Versioned | None:
        check_key(key)
        entry = self._enter(f"get {key!r}").entries.get(key)
        return None if entry is None else Versioned(entry.value, entry.mod_revision)

    async def get_prefix(self, prefix: str) -> tuple[dict[str, Versioned], int]:
        state = self._enter(f"get_prefix {prefix!r}")
        found = {key: Versioned(entry.value, entry.mod_revision)
                 for key, entry in sorted(state.entries.items()) if key.startswith(prefix)}
        return found, state.revision

    async def commit(self, compares: Sequence[Compare], puts: Sequence[Put],
                     deletes: Sequence[str]) -> bool:
        check_txn(compares, puts, deletes)
        state = self._enter("commit")
        lost_reply = False
        if self.fail_next_commits:
            lost_reply = self.fail_next_commits.pop(0)
            if not lost_reply:
                raise MetadataUnavailable("commit: failed before it was sent (test hook)",
                                          endpoints=self.ENDPOINTS)
        held = all(
            (entry.mod_revision if (entry := state.entries.get(c.key)) else 0) == c.mod_revision
            for c in compares
        )
        if held:
            missing = [put.lease for put in puts
                       if put.lease is not None and put.lease not in state.leases]
            if missing:
                raise LeaseNotFound(missing)
            state.apply(puts, deletes)
        if lost_reply:
            raise MetadataUnavailable("commit: the reply was lost (test hook)",
                                      endpoints=self.ENDPOINTS, maybe_applied=True)
        return held

    async def grant_lease(self, ttl_s: int) -> int:
        check_ttl(ttl_s)
        state = self._enter("grant_lease")
        lease_id = state.next_lease_id
        state.next_lease_id += 1
        state.leases[lease_id] = _Lease(ttl_s * 1000, state.clock_ms() + ttl_s * 1000)
        return lease_id

    async def keep_alive(self, lease_id: int) -> bool:
        state = self._enter(f"keep_alive {lease_id}")
        lease = state.leases.get(lease_id)
        if lease is None:
            return False
        lease.expires_at_ms = state.clock_ms() + lease.ttl_ms
        return True

    async def revoke(self, lease_id: int) -> None:
        self._enter(f"revoke {lease_id}").end_lease(lease_id)

    async def watch_prefix(self, prefix: str, *,
                           start_revision: int) -> AsyncGenerator[list[WatchEvent], None]:
        check_start_revision(start_revision)
        what = f"watch {prefix!r}"
        next_revision = start_revision
        while not self._closed:
            state = self._enter(what)
            if next_revision < state.compact_revision:
                raise WatchCompacted(next_revision, state.compact_revision)
            events, next_revision = state.events_since(prefix, next_revision)
            if events:
                yield events
                continue
            waiter = asyncio.get_running_loop().create_future()
            state.waiters.add(waiter)
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                state.waiters.discard(waiter)
                self._waiters.discard(waiter)

    async def close(self) -> None:
        self._closed = True
        self._wake_own()

    def _wake_own(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
