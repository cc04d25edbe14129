"""A leader's replica fetch sessions (Kafka's incremental fetch sessions,
KIP-227), one per follower store (docs/replication.md, "Fetch sessions").

A follower copies every partition it follows on this store with one fetch
loop. Its first request opens a session and lists them all; later requests
list only the partitions whose fetch offset or leader epoch changed. The
session remembers the rest, so a request and its answer cost in proportion
to what moved, not to the partitions followed, and a parked request is
woken by the partitions themselves (`notify`, on an append or a change of
leadership), not by polling them: an idle partition costs nothing.

Only the bookkeeping lives here; the runtime reads the log and checks epochs
(ReplicaServing.replica_fetch_session, replication/serving.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ...common.kernel.invariants import invariant

PartitionKey = tuple[str, int]


@dataclass(slots=True)
class SessionEntry:
    """What the leader knows of one partition a follower fetches."""

    # The follower's log end offset as it last said (where its next batch
    # starts).
    fetch_offset: int
    # The leader epoch it follows.
    leader_epoch: int
    max_bytes: int
    # The high watermark last sent to this follower (-1: none yet).
    sent_high_watermark: int = -1


@dataclass(slots=True)
class FetchSession:
    replica_id: int
    session_id: int
    # The epoch of the last request taken (the next must be one more).
    epoch: int
    entries: dict[PartitionKey, SessionEntry] = field(default_factory=dict)
    # Partitions with something new to copy (or an error to tell), and
    # those whose HW moved, since the last answer; dicts keep the order
    # they came in, so a simulation run replays the same.
    ready: dict[PartitionKey, None] = field(default_factory=dict)
    hw_moved: dict[PartitionKey, None] = field(default_factory=dict)
    # Partitions the last answer carried batches of: if the next request
    # does not list them (the follower dropped that answer), they are sent
    # again.
    answered: dict[PartitionKey, None] = field(default_factory=dict)
    # The parked request's wake-up, while one waits.
    waiter: asyncio.Future[None] | None = None
    # Partitions where the follower is outside the ISR, to check for
    # rejoining at its next request (Catalog._recheck_rejoin, catalog.py).
    rejoin_checks: dict[PartitionKey, None] = field(default_factory=dict)

    def take_rejoin_checks(self) -> list[PartitionKey]:
        keys = list(self.rejoin_checks)
        self.rejoin_checks.clear()
        return keys

    def take_ready(self) -> list[PartitionKey]:
        ready = list(self.ready)
        self.ready.clear()
        return ready

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class FetchSessions:
    """Every follower store's session on this leader, and which sessions
    fetch each partition (so that an append wakes only those)."""

    def __init__(self) -> None:
        self._by_replica: dict[int, FetchSession] = {}
        self._watchers: dict[PartitionKey, dict[int, None]] = {}
        self._next_session_id = 1

    def __len__(self) -> int:
        return len(self._by_replica)

    def open(self, replica_id: int) -> FetchSession:
        """A new session for the follower, replacing its previous one (a
        follower runs one fetch loop per leader; a new opening means it lost
        track of the old session)."""
        self.close(replica_id)
        session = FetchSession(replica_id, self._next_session_id, epoch=1)
        self._next_session_id += 1
        self._by_replica[replica_id] = session
        return session

    def take(self, replica_id: int, session_id: int, epoch: int) -> FetchSession | None:
        """The session a request continues, when its epoch is the next one
        (a request lost, repeated or overtaken breaks the sequence: the
        follower then opens a new session). None when there is no such
        session."""
        session = self._by_replica.get(replica_id)
        if session is None or session.session_id != session_id or epoch != session.epoch + 1:
            return None
        session.epoch = epoch
        return session

    def check_rejoin(self, replica_id: int, key: PartitionKey) -> None:
        """Asks for a rejoin check of the partition at the follower's next
        request, when its session holds the partition."""
        session = self._by_replica.get(replica_id)
        if session is not None and key in session.entries:
            session.rejoin_checks[key] = None

    def is_open(self, session: FetchSession) -> bool:
        return self._by_replica.get(session.replica_id) is session

    def close(self, replica_id: int) -> None:
        session = self._by_replica.pop(replica_id, None)
        if session is None:
            return
        for key in session.entries:
            self._unwatch(key, replica_id)
        session.wake()

    def close_all(self) -> None:
        for replica_id in list(self._by_replica):
            self.close(replica_id)

    def put(self, session: FetchSession, key: PartitionKey, entry: SessionEntry) -> None:
        invariant(self._by_replica.get(session.replica_id) is session,
                  f"store node {session.replica_id}'s fetch session {session.session_id} "
                  "is not open")
        session.entries[key] = entry
        self._watchers.setdefault(key, {})[session.replica_id] = None

    def forget(self, session: FetchSession, key: PartitionKey) -> None:
        if session.entries.pop(key, None) is not None:
            self._unwatch(key, session.replica_id)
        session.ready.pop(key, None)
        session.hw_moved.pop(key, None)
        session.answered.pop(key, None)

    def notify(self, key: PartitionKey, *, urgent: bool) -> None:
        """The partition changed. Urgent news (batches to copy, a change of
        leadership) wakes the sessions fetching it; a moved HW waits for
        their next answer."""
        watchers = self._watchers.get(key)
        if not watchers:
            return
        for replica_id in watchers:
            session = self._by_replica[replica_id]
            if urgent:
                session.ready[key] = None
                session.wake()
            else:
                session.hw_moved[key] = None

    def _unwatch(self, key: PartitionKey, replica_id: int) -> None:
        watchers = self._watchers.get(key)
        if watchers is not None:
            watchers.pop(replica_id, None)
            if not watchers:
                del self._watchers[key]
