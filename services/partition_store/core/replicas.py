"""Replicas of a partition: placement, leader election, the in-sync set and
the high watermark (Kafka's in-sync-replica protocol; docs/replication.md).

Pure decisions, shared by the controller (which elects leaders), the leaders
(which shrink and expand their in-sync replica set, ISR) and the static
single-copy layout. The stored form of a partition's state is JSON, kept in
the metadata store (etcd) under the partition's key; every change is written
by a transaction that compares the revision it was decided on, so a stale
decision is refused rather than applied.

Rules (Kafka's):
* The first replica is the preferred leader. Placement spreads replicas by
  store index, starting at the partition's own offset into the store list.
* A new leader comes from the ISR (unclean election, from any live replica,
  only when asked for). Every change of leader bumps the leader epoch. With no
  candidate the partition is offline (leader -1) and keeps its ISR, so that
  the last in-sync replica can lead again when it returns.
* The leader is always in the ISR. A follower leaves when it lags more than
  replica.lag.time.max.ms and rejoins once it has reached the leader's high
  watermark.
* The high watermark is the least log end offset over the ISR, and never
  moves back.
* Controlled shutdown (Kafka's): a store that is asked to stop first asks
  the controller to move each partition it leads to another live in-sync
  replica, at a new epoch and with the ISR as it was (the stopping store
  stays in sync, and serves as a follower, until its lease ends). A
  partition with no such replica stays where it is. No store that is
  stopping is given leadership by a move or a rebalance.
* Moving replicas (Kafka's KIP-455 reassignment): the target replica list is
  recorded first and the new replicas are added to the replica list (they
  start copying, outside the ISR); once every target replica is in the ISR,
  the replica list becomes the target, the replicas left out go, and if the
  leader was one of them, the first in-sync target replica leads at a new
  epoch.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

NO_LEADER = -1
DEFAULT_REPLICATION_FACTOR = 3
DEFAULT_MIN_INSYNC_REPLICAS = 2
K = TypeVar("K")

# Kafka's replica.lag.time.max.ms default.
DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000
# Kafka's leader.imbalance.check.interval.seconds (300) and
# leader.imbalance.per.broker.percentage (10) defaults.
DEFAULT_LEADER_IMBALANCE_CHECK_INTERVAL_MS = 300_000
DEFAULT_LEADER_IMBALANCE_PER_STORE_PCT = 10
# A store that comes back (its lease had ended) gets its preferred
# leaderships back soon rather than at the next periodic check (Kafka's
# five minutes, which left one store leading everything after a restart):
# the controller checks the imbalance once the store has stayed up this long
# (a store that flaps moves nothing), and again at that pace while the store
# catches up into the ISRs, for a bounded window; after it, the periodic
# check as before.
PREFERRED_LEADER_REJOIN_DELAY_MS = 5_000
PREFERRED_LEADER_REJOIN_WINDOW_MS = 120_000


class ReplicaStateError(ValueError):
    """A stored partition state that does not decode or breaks the rules."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Who holds a partition, who leads it, at which epoch, and who is in sync."""

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    # A reassignment in progress: the replica list asked for (None: none).
    target: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.replicas or len(set(self.replicas)) != len(self.replicas):
            raise ReplicaStateError(f"replicas {self.replicas} must be distinct and not empty")
        if not set(self.isr) <= set(self.replicas):
            raise ReplicaStateError(f"ISR {self.isr} is not within replicas {self.replicas}")
        if self.leader != NO_LEADER and self.leader not in self.isr:
            raise ReplicaStateError(f"leader {self.leader} is not in the ISR {self.isr}")
        if self.leader_epoch < 0:
            raise ReplicaStateError(f"leader epoch {self.leader_epoch} is negative")
        if self.target is not None and (
                not self.target or len(set(self.target)) != len(self.target)):
            raise ReplicaStateError(f"target replicas {self.target} must be distinct and "
                                    "not empty")

    @property
    def online(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0]

    def to_json(self) -> str:
        doc: dict[str, object] = {
            "replicas": list(self.replicas), "leader": self.leader,
            "leader_epoch": self.leader_epoch, "isr": list(self.isr),
        }
        if self.target is not None:
            doc["target"] = list(self.target)
        return json.dumps(doc, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> PartitionState:
        try:
            raw = json.loads(text)
            target = raw.get("target")
            return PartitionState(
                replicas=tuple(int(r) for r in raw["replicas"]), leader=int(raw["leader"]),
                leader_epoch=int(raw["leader_epoch"]), isr=tuple(int(r) for r in raw["isr"]),
                target=None if target is None else tuple(int(r) for r in target),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplicaStateError(f"partition state {text!r} does not decode: {exc}") from exc


def initial_state(replicas: Sequence[int]) -> PartitionState:
    """A new partition: every replica is empty, hence in sync; the preferred
    replica leads at epoch 0."""
    return PartitionState(tuple(replicas), replicas[0], 0, tuple(replicas))


def assign_replicas(
    *, first_store_index: int, partitions: int, stores: Sequence[int], replication_factor: int,
    first_partition: int = 0,
) -> list[tuple[int, ...]]:
    """Replica lists for `partitions` partitions of a topic, numbered from
    `first_partition` (0 for a new topic; the current count for partitions
    added to it, so they are placed as if the topic had been created with
    them): partition p starts at store index (first_store_index + p) and
    takes the next replication_factor stores in index order, so leaders and
    copies spread over the stores."""
    if not 1 <= replication_factor <= len(stores):
        raise ValueError(
            f"replication factor {replication_factor} needs 1..{len(stores)} stores"
        )
    ordered = sorted(stores)
    n = len(ordered)
    return [
        tuple(ordered[(first_store_index + p + i) % n] for i in range(replication_factor))
        for p in range(first_partition, first_partition + partitions)
    ]


def replication_factor_of(state: PartitionState) -> int:
    """How many copies a partition is meant to have: its replica list, or
    the target of a move in progress (during a move the list also holds
    the replicas that are leaving)."""
    return len(state.target if state.target is not None else state.replicas)


def default_replication_factor(store_count: int) -> int:
    return min(DEFAULT_REPLICATION_FACTOR, store_count)


def effective_min_insync(min_insync_replicas: int, replication_factor: int) -> int:
    """min.insync.replicas, capped by the replication factor (a single-copy
    topic is writable with min ISR 2)."""
    return max(1, min(min_insync_replicas, replication_factor))


def elect_leader(
    state: PartitionState, live: Collection[int], *, unclean: bool = False
) -> PartitionState | None:
    """The state after the controller saw the leader's store go (or an
    offline partition's replicas come back); None when nothing changes.

    The new leader is the first live ISR member in replica order (the
    preferred one first); unclean election takes any live replica and makes
    it the whole ISR (records only the old ISR had are lost: that is what
    "unclean" means). With no candidate the partition goes offline and keeps
    its ISR."""
    if state.leader in live:
        return None
    in_sync = [r for r in state.replicas if r in state.isr and r in live]
    if in_sync:
        leader = in_sync[0]
        # Dead members leave the ISR with the leader change: the new leader
        # would remove them anyway, after replica.lag.time.max.ms, and until
        # then every acks=all produce would wait for them.
        isr = tuple(r for r in state.isr if r in live)
        return replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=isr)
    if unclean:
        candidates = [r for r in state.replicas if r in live]
        if candidates:
            return replace(state, leader=candidates[0], leader_epoch=state.leader_epoch + 1,
                           isr=(candidates[0],))
    if state.leader == NO_LEADER:
        return None
    return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1)


def is_unclean(before: PartitionState, after: PartitionState) -> bool:
    """Whether an election picked a leader outside the ISR it had."""
    return after.online and after.leader not in before.isr


def fence_replica(state: PartitionState, replica: int) -> PartitionState | None:
    """The state after `replica`'s store restarted (it is not the replica it
    was: its disk may be empty): it leaves the ISR, and if it led, the
    partition gets a new epoch without a leader for the controller to fill.
    Alone in the ISR it stays there (the only copy there is) and, if it led,
    the epoch still moves on. None when it was not in the ISR."""
    if replica not in state.isr:
        return None
    if state.isr == (replica,):
        if state.leader != replica:
            return None
        return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1)
    isr = tuple(r for r in state.isr if r != replica)
    if state.leader == replica:
        return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1, isr=isr)
    return replace(state, isr=isr)


def move_leader_off(state: PartitionState, leaving: Collection[int],
                    live: Collection[int]) -> PartitionState | None:
    """Controlled shutdown: the state after the controller moved leadership
    away from a store that asked to stop (`leaving`). The first in-sync
    replica, in replica order, that is live and not leaving itself leads at
    the next epoch; the ISR is kept as it is, the leaving store included: it
    goes on copying as a follower until its lease ends, so acks=all appends
    do not lose a copy early. None when the leader is not leaving, or when no
    other in-sync replica can lead (the partition stays, as Kafka's does: a
    move to nobody would take it offline before it has to be)."""
    if not state.online or state.leader not in leaving:
        return None
    for replica in state.replicas:
        if replica in state.isr and replica in live and replica not in leaving:
            return replace(state, leader=replica, leader_epoch=state.leader_epoch + 1)
    return None


def leaderships_to_hand_over(
    states: Mapping[K, PartitionState], node_id: int, *, live: Collection[int],
    leaving: Collection[int],
) -> list[K]:
    """The partitions that `node_id`, stopping, still leads and could hand
    over (move_leader_off would move them): what its controlled shutdown
    waits for. Empty once every partition it led has moved or has no other
    in-sync replica to move to."""
    leaving_too = {*leaving, node_id}
    return [key for key, state in states.items()
            if state.leader == node_id
            and move_leader_off(state, leaving_too, live) is not None]


def in_sync_everywhere(states: Iterable[PartitionState], node_id: int) -> bool:
    """Whether `node_id` is in the ISR of every partition it is a replica of
    that can be in sync at all: one with a leader (an offline partition has
    nobody to copy from) and not being moved (a replica a move adds copies
    for as long as the move takes). A restarted store becomes so once it
    has caught up everywhere; a rolling restart waits for that before it
    stops the next store (readiness, docs/helm.md)."""
    return all(node_id in state.isr for state in states
               if node_id in state.replicas and state.online and state.target is None)


def begin_reassignment(state: PartitionState, target: Sequence[int]) -> PartitionState:
    """Records a move to `target` (or, with the current replicas as target,
    cancels one): the new replicas join the replica list at once, as
    followers outside the ISR."""
    wanted = tuple(target)
    if wanted == state.replicas:
        return replace(state, target=None)
    # During the move the list holds the target first, then the replicas
    # leaving (Kafka's order), so the preferred leader is the target's.
    base = state.replicas if state.target is None else tuple(
        r for r in state.replicas if r in state.isr or r in wanted)
    replicas = wanted + tuple(r for r in base if r not in wanted)
    isr = tuple(r for r in replicas if r in state.isr)
    return PartitionState(replicas, state.leader, state.leader_epoch, isr, wanted)


def finish_reassignment(state: PartitionState) -> PartitionState | None:
    """Completes a move once every target replica is in sync: the replicas
    not in the target go; a leader among them hands over to the first
    in-sync target replica at a new epoch. None: not yet (or no move)."""
    target = state.target
    if target is None or not set(target) <= set(state.isr):
        return None
    isr = tuple(r for r in target if r in state.isr)
    if state.leader in target:
        return PartitionState(target, state.leader, state.leader_epoch, isr)
    return PartitionState(target, isr[0], state.leader_epoch + 1, isr)


def elect_preferred(state: PartitionState, live: Collection[int]) -> PartitionState | None:
    """Moves leadership back to the preferred replica when it is live, in sync
    and not leading (Kafka's preferred leader election); None otherwise."""
    preferred = state.preferred_leader
    if state.leader == preferred or preferred not in live or preferred not in state.isr:
        return None
    return replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)


def plan_preferred_elections(
    states: Mapping[K, PartitionState], live: Collection[int], *, imbalance_pct: int,
) -> dict[K, PartitionState]:
    """Kafka's automatic leader rebalance, run every leader imbalance check
    interval: a store's imbalance is the share of the partitions it prefers
    to lead (it is their first replica) that another replica leads. For each
    store above `imbalance_pct` percent, leadership of those partitions moves
    back to it where it is live and in sync (elect_preferred). Not at once
    on rejoining: each move is a leader change producers and followers must
    follow, so a store that flaps does not drag leadership back and forth;
    the controller runs it soon after a store comes back
    (PREFERRED_LEADER_REJOIN_DELAY_MS) as well as periodically."""
    preferred_of: dict[int, list[K]] = {}
    for key, state in states.items():
        if state.online:
            preferred_of.setdefault(state.preferred_leader, []).append(key)
    plan: dict[K, PartitionState] = {}
    for keys in preferred_of.values():
        led_elsewhere = [k for k in keys if states[k].leader != states[k].preferred_leader]
        if len(led_elsewhere) * 100 <= imbalance_pct * len(keys):
            continue
        for key in led_elsewhere:
            after = elect_preferred(states[key], live)
            if after is not None:
                plan[key] = after
    return plan


def shrink_isr(state: PartitionState, remove: Collection[int]) -> PartitionState | None:
    """The leader drops lagging followers (never itself); None: no change."""
    isr = tuple(r for r in state.isr if r not in remove or r == state.leader)
    return None if isr == state.isr else replace(state, isr=isr)


def expand_isr(state: PartitionState, replica: int) -> PartitionState | None:
    """A caught-up follower rejoins; the ISR stays in replica order."""
    if replica in state.isr or replica not in state.replicas:
        return None
    members = set(state.isr) | {replica}
    return replace(state, isr=tuple(r for r in state.replicas if r in members))


def high_watermark(
    *, current: int, leader: int, leader_end_offset: int, isr: Collection[int],
    follower_end_offsets: Mapping[int, int],
) -> int:
    """The least log end offset over the ISR (the leader's is its durable
    end), never below `current`. A follower in the ISR that has not fetched
    yet holds the HW where it is."""
    bound = leader_end_offset
    for replica in isr:
        if replica == leader:
            continue
        end = follower_end_offsets.get(replica)
        if end is None:
            return current
        bound = min(bound, end)
    return max(current, bound)


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    """What the leader noted at a follower's fetch: where its own log ended
    then, and when."""

    leader_end_offset: int
    at_ms: int


def caught_up_ms(*, fetch_offset: int, leader_end_offset: int, now_ms: int,
                 previous: FollowerFetch | None) -> int | None:
    """When a follower's fetch (from `fetch_offset`) shows it was last
    caught up (Kafka's Replica.updateFetchState): now, when it asks from the
    leader's log end; at its previous fetch, when it asks from where the
    log ended then; None when it is behind both. The second case is a
    follower one round behind a partition written all the time: by the
    time it asks again, more has been appended, so it never asks from the
    log end itself, yet it copied everything there was when it last asked.
    Judged by the first case alone it would leave the ISR after the lag
    time under any steady load."""
    if fetch_offset >= leader_end_offset:
        return now_ms
    if previous is not None and fetch_offset >= previous.leader_end_offset:
        return previous.at_ms
    return None


def lagging_followers(
    *, isr: Collection[int], leader: int, last_caught_up_ms: Mapping[int, int], now_ms: int,
    lag_time_max_ms: int, follower_end_offsets: Mapping[int, int] | None = None,
    leader_end_offset: int | None = None,
) -> set[int]:
    """ISR followers whose last time at the leader's log end is more than
    lag_time_max_ms ago (Kafka's replica.lag.time.max.ms). `last_caught_up_ms`
    starts at the time the leader took over, so a follower that never fetches
    leaves after the same delay. A follower known to hold the whole log
    (its end offset at `leader_end_offset`) is caught up whenever it last
    fetched, as in Kafka's isCaughtUp: a follower of an idle partition sends
    nothing for it, and leaves only when its store does."""
    ends = follower_end_offsets or {}
    return {
        r for r in isr
        if r != leader and now_ms - last_caught_up_ms.get(r, now_ms) > lag_time_max_ms
        and (leader_end_offset is None or ends.get(r, -1) < leader_end_offset)
    }


def check_leader_epoch(*, known: int | None, current: int) -> str | None:
    """A request's leader epoch against the replica's: None when it may go
    on; "fenced" when the sender's is older (its metadata is stale),
    "unknown" when it is newer (this replica has not heard of it yet)."""
    if known is None or known < 0 or known == current:
        return None
    return "fenced" if known < current else "unknown"
