"""Kafka's classic group protocol: groups whose elected leader member
computes the assignment (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), the
protocol of every Kafka client by default (docs/groups.md, "Classic groups").

The rules are those of Kafka's classic group coordinator (its ClassicGroup
and GroupMetadataManager): a rebalance (PreparingRebalance) parks every
member's JoinGroup until all known members have rejoined or the rebalance
timeout passes; the join phase then completes — members that did not rejoin
are removed, the generation moves, a protocol every member supports is
chosen by the members' votes, and each parked JoinGroup is answered, the
leader's with every member's metadata. The group waits (CompletingRebalance)
for the leader's SyncGroup with the assignments; the followers' SyncGroups
are parked until it comes, and the group is Stable.

A group is one value with two parts:

* **durable** — generation, protocol type and name, leader, and per member
  its ids, client id and host, timeouts, metadata of the selected protocol
  and assignment: Kafka's GroupMetadata record (`snapshot`), written to
  `__consumer_offsets` when the leader's assignment completes a rebalance,
  when the group empties, and when a static member takes another's place.
  Replaying it (`from_snapshot`) gives a Stable group, or an Empty one;
* **live** — the rebalance in progress, which JoinGroup and SyncGroup calls
  are parked, members pending a join or a sync, and every deadline. As in
  Kafka it is never written: a new coordinator starts from the last record
  and the members rejoin.

Every planner takes the group and `now_ms` and returns an `Outcome`: the
group after the request, whether its record must be written first, the
caller's answer (or none: the call is parked), and the answers of parked
calls of other members that this step completes. Nothing here waits or
reads a clock: deadlines are values that `plan_tick` acts on.

The planners work on a private mutable copy (`_Scratch`), written in the
order of Kafka's code so the two can be compared line by line; the
caller's group is never changed, so a refused request leaves no trace.
"""

from __future__ import annotations

import base64
import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeAlias, TypeVar

from oncelog.wire.errors import ErrorCode
from oncelog.wire.vocabulary import GroupState as WireGroupState

from ...common.kernel import limits
from ...common.kernel.errors import ServiceError
from ...common.kernel.invariants import invariant
from .groups import Group

# ListGroups/DescribeGroups group types (Kafka's ListGroups v5 names).
CLASSIC = "classic"
CONSUMER = "consumer"
# The member's protocol type of Kafka's consumers; also what a
# server-assigned group lists as its protocol type (as Kafka's do).
CONSUMER_PROTOCOL_TYPE = "consumer"
# A generation id for commits outside the group protocol (assign()).
NO_GENERATION = -1
# The type tag of a classic group's record in `__consumer_offsets` (records
# of server-assigned groups have none).
RECORD_TYPE = "classic"


# The values are the wire's shared vocabulary (oncelog.wire.vocabulary), the
# names DescribeTransactions/DescribeGroups report.
class ClassicGroupState(enum.StrEnum):
    """The states of a classic group (Kafka's ClassicGroupState). Each
    state's doc says how it answers each request (action) and where it can
    go (transition)."""

    EMPTY = WireGroupState.EMPTY.value
    """No members (perhaps only committed offsets).
    action: JoinGroup from a new member starts the initial rebalance; SyncGroup,
    Heartbeat, LeaveGroup and a member's offset commit answer
    UNKNOWN_MEMBER_ID; a commit outside the group protocol is accepted.
    transition: PreparingRebalance (a member joins), Dead."""

    PREPARING_REBALANCE = WireGroupState.PREPARING_REBALANCE.value
    """Waiting for every known member to rejoin (at most the rebalance timeout;
    a new group also waits its initial rebalance delay).
    action: JoinGroup is parked until the join phase completes; Heartbeat and
    SyncGroup answer REBALANCE_IN_PROGRESS; LeaveGroup removes the member;
    offset commits of the current generation are accepted.
    transition: CompletingRebalance (the join phase completes with members),
    Empty (it completes without), Dead."""

    COMPLETING_REBALANCE = WireGroupState.COMPLETING_REBALANCE.value
    """The join phase is over; waiting for the leader's assignment.
    action: the leader's SyncGroup stores the assignment and answers every
    parked SyncGroup; a follower's is parked; Heartbeat answers normally;
    offset commits answer REBALANCE_IN_PROGRESS (transactional ones are
    accepted); a JoinGroup with the same protocols is answered at once, with
    other protocols it starts a new rebalance, as does a leave or an expiry.
    transition: Stable (the leader's assignment is stored), PreparingRebalance,
    Dead."""

    STABLE = WireGroupState.STABLE.value
    """Every member has its assignment.
    action: Heartbeat and SyncGroup answer normally (SyncGroup with the
    member's assignment); JoinGroup from the leader or with other protocols
    starts a rebalance, a follower's with the same protocols is answered at
    once; a static member rejoining under a new member id takes the old one's
    place without a rebalance when the group's protocol stays selectable.
    transition: PreparingRebalance (join, leave, expiry), Dead."""

    DEAD = WireGroupState.DEAD.value
    """The group is being removed. Kafka's coordinator passes through it when it
    drops a group; this one drops a group's value at once (a deleted or expired
    group is simply unknown: requests then see no group), so no value stays
    Dead. Kept for the table, which is Kafka's.
    action: every request answers COORDINATOR_NOT_AVAILABLE.
    transition: none."""


# The one table of allowed transitions: state -> the states it may be entered from.
VALID_PREVIOUS: Mapping[ClassicGroupState, frozenset[ClassicGroupState]] = {
    ClassicGroupState.EMPTY: frozenset({ClassicGroupState.PREPARING_REBALANCE}),
    ClassicGroupState.PREPARING_REBALANCE: frozenset({
        ClassicGroupState.STABLE, ClassicGroupState.COMPLETING_REBALANCE,
        ClassicGroupState.EMPTY,
    }),
    ClassicGroupState.COMPLETING_REBALANCE: frozenset({ClassicGroupState.PREPARING_REBALANCE}),
    ClassicGroupState.STABLE: frozenset({ClassicGroupState.COMPLETING_REBALANCE}),
    ClassicGroupState.DEAD: frozenset(ClassicGroupState),
}


def check_transition(current: ClassicGroupState, target: ClassicGroupState,
                     group_id: str) -> None:
    """Crashes on a transition the table does not allow: planners only ask
    for allowed ones, so a refusal here is a bug, not bad input."""
    invariant(
        current in VALID_PREVIOUS[target],
        lambda: f"group {group_id!r}: illegal transition {current.value} -> {target.value}",
    )


@dataclass(frozen=True, slots=True)
class Protocol:
    """One protocol a member supports (for Kafka's consumers: an assignor's
    name and the member's subscription encoded for it)."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicMember:
    member_id: str
    instance_id: str = ""
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    # In the member's order of preference (its vote is the first it can).
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    # ---- live only (never in the record)
    # A JoinGroup / SyncGroup of this member is parked, waiting for the
    # join phase / the leader's assignment.
    awaiting_join: bool = False
    awaiting_sync: bool = False
    # Added in the rebalance under way; such a member can time out while its
    # JoinGroup is parked (after `new_member_join_timeout_ms`).
    is_new: bool = False
    # When its session ends unless renewed (-1: no session timer running,
    # as after a load until `start_sessions`, or while a parked call stands
    # in for heartbeats).
    deadline_ms: int = -1

    @property
    def protocol_names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.protocols)

    def metadata(self, protocol_name: str) -> bytes:
        for protocol in self.protocols:
            if protocol.name == protocol_name:
                return protocol.metadata
        invariant(False, lambda: f"member {self.member_id!r} does not support protocol "
                                 f"{protocol_name!r}, which its group selected")
        return b""

    def vote(self, candidates: frozenset[str]) -> str:
        """The member's preferred protocol among those every member supports."""
        for protocol in self.protocols:
            if protocol.name in candidates:
                return protocol.name
        invariant(False, lambda: f"member {self.member_id!r} supports none of {sorted(candidates)}")
        return ""

    @property
    def has_satisfied_heartbeat(self) -> bool:
        """Whether its session timer may pass without removing it: a parked
        call stands in for heartbeats, except a new member's join."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


@dataclass(frozen=True, slots=True)
class JoinTimer:
    """When the join phase ends even if some member has not rejoined. For a
    new group's initial rebalance (`initial`), Kafka's
    group.initial.rebalance.delay.ms: each time it fires after new members
    arrived, it is extended by the delay again, up to `remaining_ms` more."""

    deadline_ms: int
    initial: bool = False
    delay_ms: int = 0
    remaining_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicGroup:
    group_id: str
    generation_id: int = 0
    # Empty: none yet (no member has joined since the group was created).
    protocol_type: str = ""
    # The protocol selected for the generation; empty when Empty or before
    # the first join phase completes.
    protocol_name: str = ""
    leader_id: str = ""
    # In join order (the first member left leads when the leader goes).
    members: Mapping[str, ClassicMember] = field(default_factory=dict)
    state: ClassicGroupState = ClassicGroupState.EMPTY
    previous_state: ClassicGroupState = ClassicGroupState.EMPTY
    state_timestamp_ms: int = -1
    # ---- live only (never in the record)
    # Member ids handed out with MEMBER_ID_REQUIRED, not joined yet -> the
    # deadline for their second JoinGroup. A rebalance waits for them too.
    pending_members: Mapping[str, int] = field(default_factory=dict)
    # Members that must send SyncGroup before `sync_deadline_ms` (-1: none).
    pending_sync: frozenset[str] = frozenset()
    sync_deadline_ms: int = -1
    join_timer: JoinTimer | None = None
    # A member joined during the initial rebalance's delay: extend it.
    new_member_added: bool = False

    @property
    def is_empty(self) -> bool:
        return self.state is ClassicGroupState.EMPTY

    def static_member_id(self, instance_id: str) -> str | None:
        return _static_member_id(self.members, instance_id)

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline `plan_tick` acts on (None: none runs)."""
        deadlines = [m.deadline_ms for m in self.members.values() if m.deadline_ms >= 0]
        deadlines.extend(self.pending_members.values())
        if self.sync_deadline_ms >= 0:
            deadlines.append(self.sync_deadline_ms)
        if self.join_timer is not None:
            deadlines.append(self.join_timer.deadline_ms)
        return min(deadlines, default=None)


AnyGroup: TypeAlias = Group | ClassicGroup


@dataclass(frozen=True, slots=True)
class ClassicConfig:
    # Kafka's group.initial.rebalance.delay.ms: a new group's first join phase
    # waits this long (extended while members keep arriving, up to the
    # rebalance timeout), so that members starting together land in one
    # generation instead of a rebalance each.
    initial_rebalance_delay_ms: int = 3000
    # How long a new member's JoinGroup may stay parked before the member is
    # dropped (Kafka's 5 minutes): a client that gave up cannot leave
    # members behind for ever.
    new_member_join_timeout_ms: int = 300_000
    min_session_timeout_ms: int = 1000
    max_session_timeout_ms: int = 300_000


# ------------------------------------------------------------------ answers


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    instance_id: str
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinReply:
    error: ServiceError | None = None
    member_id: str = ""
    generation_id: int = NO_GENERATION
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    # To the leader only: every member with its metadata of the protocol.
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncReply:
    error: ServiceError | None = None
    protocol_type: str = ""
    protocol_name: str = ""
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    error: ServiceError | None = None


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str
    instance_id: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LeaveResult:
    member_id: str
    instance_id: str
    error: ServiceError | None = None


R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome(Generic[R]):
    """What one request or timer step does to a group."""

    # The group after the step; None: the step leaves the stored group (of
    # either type, or none) as it is.
    group: ClassicGroup | None
    # Write `snapshot(group)` to the log before applying or answering anything.
    persist: bool = False
    # The caller's answer; None: the call is parked under `member_id` until
    # a later step answers it in `join_replies` / `sync_replies`.
    reply: R | None = None
    member_id: str = ""
    # Parked calls of other members that this step answers.
    join_replies: Mapping[str, JoinReply] = field(default_factory=dict)
    sync_replies: Mapping[str, SyncReply] = field(default_factory=dict)


def _error(code: ErrorCode, message: str) -> ServiceError:
    return ServiceError(code, message)


def _static_member_id(members: Mapping[str, ClassicMember], instance_id: str) -> str | None:
    if not instance_id:
        return None
    for member in members.values():
        if member.instance_id == instance_id:
            return member.member_id
    return None


def validate_member(group_id: str, members: Mapping[str, ClassicMember], member_id: str,
                    instance_id: str, operation: str) -> ServiceError | None:
    """Kafka's validateMember: a static member's instance id must map to its
    member id (FENCED_INSTANCE_ID: another process took its place), and the
    member must exist (UNKNOWN_MEMBER_ID)."""
    where = f"group {group_id!r}"
    if instance_id:
        holder = _static_member_id(members, instance_id)
        if holder is None:
            return _error(ErrorCode.UNKNOWN_MEMBER_ID,
                          f"{where} has no static member with group instance id "
                          f"{instance_id!r} ({operation} from member {member_id!r})")
        if holder != member_id:
            return _error(ErrorCode.FENCED_INSTANCE_ID,
                          f"{where}: group instance id {instance_id!r} is now member "
                          f"{holder!r}; member {member_id!r} was replaced ({operation})")
    if member_id not in members:
        return _error(ErrorCode.UNKNOWN_MEMBER_ID,
                      f"{where} has no member {member_id!r} ({operation}); it was removed "
                      "(session or rebalance timeout) or left: join again")
    return None


# ------------------------------------------------------------ the scratch copy


class _Scratch:
    """A mutable copy of one group with Kafka's operations on it, collecting
    the answers to parked calls. `freeze()` gives the value back."""

    def __init__(self, group: ClassicGroup, now_ms: int, config: ClassicConfig) -> None:
        self.group_id = group.group_id
        self.generation_id = group.generation_id
        self.protocol_type = group.protocol_type
        self.protocol_name = group.protocol_name
        self.leader_id = group.leader_id
        self.members: dict[str, ClassicMember] = dict(group.members)
        self.state = group.state
        self.previous_state = group.previous_state
        self.state_timestamp_ms = group.state_timestamp_ms
        self.pending_members: dict[str, int] = dict(group.pending_members)
        self.pending_sync: set[str] = set(group.pending_sync)
        self.sync_deadline_ms = group.sync_deadline_ms
        self.join_timer = group.join_timer
        self.new_member_added = group.new_member_added
        self.now_ms = now_ms
        self.config = config
        self.persist = False
        self.join_replies: dict[str, JoinReply] = {}
        self.sync_replies: dict[str, SyncReply] = {}

    def freeze(self) -> ClassicGroup:
        return ClassicGroup(
            group_id=self.group_id, generation_id=self.generation_id,
            protocol_type=self.protocol_type, protocol_name=self.protocol_name,
            leader_id=self.leader_id, members=dict(self.members), state=self.state,
            previous_state=self.previous_state, state_timestamp_ms=self.state_timestamp_ms,
            pending_members=dict(self.pending_members),
            pending_sync=frozenset(self.pending_sync), sync_deadline_ms=self.sync_deadline_ms,
            join_timer=self.join_timer, new_member_added=self.new_member_added,
        )

    def outcome(self, reply: R | None, member_id: str = "") -> Outcome[R]:
        """The step's outcome. A parked caller answered by this very step gets
        that answer as its reply."""
        joins = dict(self.join_replies)
        syncs = dict(self.sync_replies)
        return Outcome(group=self.freeze(), persist=self.persist, reply=reply,
                       member_id=member_id, join_replies=joins, sync_replies=syncs)

    # ------------------------------------------------------------- queries

    def where(self) -> str:
        return f"group {self.group_id!r}"

    def member(self, member_id: str) -> ClassicMember:
        return self.members[member_id]

    def set_member(self, member: ClassicMember) -> None:
        self.members[member.member_id] = member

    def is_leader(self, member_id: str) -> bool:
        return bool(self.leader_id) and self.leader_id == member_id

    def static_member_id(self, instance_id: str) -> str | None:
        return _static_member_id(self.members, instance_id)

    def has_all_members_joined(self) -> bool:
        return (all(m.awaiting_join for m in self.members.values())
                and not self.pending_members)

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def supports_protocols(self, protocol_type: str, names: frozenset[str]) -> bool:
        """Whether a member with these protocols can join: any protocol type
        and protocols while Empty; else the group's type and at least one
        protocol every member supports."""
        if self.state is ClassicGroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        counts = Counter(n for m in self.members.values() for n in m.protocol_names)
        return (protocol_type == self.protocol_type
                and any(counts[n] == len(self.members) for n in names))

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (ties:
        the one voted for first, in join order)."""
        invariant(bool(self.members), lambda: f"{self.where()}: no member to select a protocol")
        counts = Counter(n for m in self.members.values() for n in m.protocol_names)
        candidates = frozenset(n for n, c in counts.items() if c == len(self.members))
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda name: votes[name])

    def validate_member(self, member_id: str, instance_id: str, operation: str
                        ) -> ServiceError | None:
        return validate_member(self.group_id, self.members, member_id, instance_id, operation)

    def current_members(self) -> tuple[JoinedMember, ...]:
        return tuple(JoinedMember(m.member_id, m.instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    def join_answer(self, member_id: str, *, leader: str | None = None,
                    with_members: bool | None = None) -> JoinReply:
        with_members = self.is_leader(member_id) if with_members is None else with_members
        return JoinReply(
            member_id=member_id, generation_id=self.generation_id,
            protocol_type=self.protocol_type, protocol_name=self.protocol_name,
            leader=self.leader_id if leader is None else leader,
            members=self.current_members() if with_members else (),
        )

    # --------------------------------------------------------- transitions

    def transition_to(self, target: ClassicGroupState) -> None:
        check_transition(self.state, target, self.group_id)
        self.previous_state = self.state
        self.state = target
        self.state_timestamp_ms = self.now_ms

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS[ClassicGroupState.PREPARING_REBALANCE]

    # ------------------------------------------------------------- members

    def add(self, member: ClassicMember) -> None:
        invariant(self.static_member_id(member.instance_id) is None,
                  lambda: f"{self.where()}: instance {member.instance_id!r} already has a member")
        if not self.members:
            self.protocol_type = member.protocol_type
        invariant(member.protocol_type == self.protocol_type,
                  lambda: f"{self.where()}: member protocol type {member.protocol_type!r}, "
                          f"group's {self.protocol_type!r}")
        if not self.leader_id:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> None:
        """Drops a member; a call of it still parked is answered
        UNKNOWN_MEMBER_ID (its client will join again if it is alive)."""
        removed = self.members.pop(member_id, None)
        if removed is not None:
            gone = _error(ErrorCode.UNKNOWN_MEMBER_ID,
                          f"{self.where()}: member {member_id!r} was removed; join again")
            if removed.awaiting_join:
                self.join_replies[member_id] = JoinReply(error=gone)
            if removed.awaiting_sync:
                self.sync_replies[member_id] = SyncReply(error=gone)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), "")
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)

    def complete_join(self, member_id: str, reply: JoinReply) -> bool:
        member = self.members[member_id]
        if not member.awaiting_join:
            return False
        self.join_replies[member_id] = reply
        self.set_member(replace(member, awaiting_join=False))
        return True

    def complete_sync(self, member_id: str, reply: SyncReply) -> bool:
        member = self.members[member_id]
        if not member.awaiting_sync:
            return False
        self.sync_replies[member_id] = reply
        self.set_member(replace(member, awaiting_sync=False))
        return True

    def reschedule(self, member_id: str, timeout_ms: int | None = None) -> None:
        member = self.members[member_id]
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        self.set_member(replace(member, deadline_ms=self.now_ms + timeout))

    def update_member(self, member_id: str, protocols: tuple[Protocol, ...],
                      rebalance_timeout_ms: int, session_timeout_ms: int) -> None:
        """A rejoin: new protocols and timeouts, and its JoinGroup parked."""
        self.set_member(replace(
            self.members[member_id], protocols=protocols,
            rebalance_timeout_ms=rebalance_timeout_ms, session_timeout_ms=session_timeout_ms,
            awaiting_join=True,
        ))

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> None:
        """A static member rejoins under a new member id: it takes the old
        one's place (protocols, assignment, leadership); a call of the old
        id still parked is answered FENCED_INSTANCE_ID."""
        old = self.members.pop(old_id)
        fenced = _error(ErrorCode.FENCED_INSTANCE_ID,
                        f"{self.where()}: group instance id {instance_id!r} rejoined as member "
                        f"{new_id!r}; member {old_id!r} is fenced")
        if old.awaiting_join:
            self.join_replies[old_id] = JoinReply(error=fenced, member_id=old_id)
        if old.awaiting_sync:
            self.sync_replies[old_id] = SyncReply(error=fenced)
        self.members[new_id] = replace(old, member_id=new_id, awaiting_join=False,
                                       awaiting_sync=False, is_new=False)
        if self.is_leader(old_id):
            self.leader_id = new_id
        # Kafka leaves the old id among the members pending a sync; the new
        # one is who will send it (else the sync deadline would remove
        # nobody and still start a rebalance).
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)

    # ------------------------------------------------------- the rebalance

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keeps the leader if it rejoined, else elects one that did; False
        when nobody rejoined (or there is nobody)."""
        if not self.leader_id:
            return False
        if self.members[self.leader_id].awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def init_next_generation(self) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(ClassicGroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = ""
            self.transition_to(ClassicGroupState.EMPTY)
        self.pending_sync.clear()

    def complete_join_phase(self) -> None:
        """Kafka's completeClassicGroupJoin: dynamic members that did not
        rejoin are removed (static ones stay: they keep their place across a
        restart), and the next generation starts."""
        self.join_timer = None
        for member in [m for m in self.members.values()
                       if not m.awaiting_join and not m.instance_id]:
            self.remove(member.member_id)
        if self.state is ClassicGroupState.DEAD:
            return
        if not self.maybe_elect_new_joined_leader() and self.members:
            # Nobody rejoined: wait another rebalance timeout (sessions will
            # remove the members that are gone).
            self.join_timer = JoinTimer(self.now_ms + self.rebalance_timeout_ms())
            return
        self.init_next_generation()
        if self.state is ClassicGroupState.EMPTY:
            self.persist = True
            return
        for member_id in list(self.members):
            self.complete_join(member_id, self.join_answer(member_id))
            self.reschedule(member_id)
            self.set_member(replace(self.members[member_id], is_new=False))
            self.pending_sync.add(member_id)
        self.sync_deadline_ms = self.now_ms + self.rebalance_timeout_ms()

    def prepare_rebalance(self) -> None:
        if self.state is ClassicGroupState.COMPLETING_REBALANCE:
            self.reset_and_propagate_assignment(_error(
                ErrorCode.REBALANCE_IN_PROGRESS,
                f"{self.where()}: a new rebalance started before the assignment of "
                f"generation {self.generation_id}; join again"))
        self.pending_sync.clear()
        self.sync_deadline_ms = -1
        initial = self.state is ClassicGroupState.EMPTY
        if initial:
            delay_ms = self.config.initial_rebalance_delay_ms
            self.join_timer = JoinTimer(
                self.now_ms + delay_ms, initial=True, delay_ms=delay_ms,
                remaining_ms=max(self.rebalance_timeout_ms() - delay_ms, 0),
            )
        self.transition_to(ClassicGroupState.PREPARING_REBALANCE)
        if not initial:
            self.maybe_complete_join_else_schedule()

    def maybe_complete_join_else_schedule(self) -> None:
        if self.has_all_members_joined():
            self.complete_join_phase()
        else:
            self.join_timer = JoinTimer(self.now_ms + self.rebalance_timeout_ms())

    def try_complete_initial_rebalance(self, timer: JoinTimer) -> None:
        if self.new_member_added and timer.remaining_ms != 0:
            self.new_member_added = False
            delay_ms = min(self.config.initial_rebalance_delay_ms, timer.remaining_ms)
            self.join_timer = JoinTimer(
                self.now_ms + delay_ms, initial=True, delay_ms=delay_ms,
                remaining_ms=max(timer.remaining_ms - timer.delay_ms, 0),
            )
        else:
            self.complete_join_phase()

    def maybe_complete_join_phase(self) -> None:
        if self.state is not ClassicGroupState.PREPARING_REBALANCE:
            return
        if self.previous_state is ClassicGroupState.EMPTY:
            return  # the initial rebalance ends with its delay
        if not self.has_all_members_joined():
            return
        self.complete_join_phase()

    def maybe_prepare_rebalance_or_complete_join(self) -> None:
        if self.can_rebalance():
            self.prepare_rebalance()
        else:
            self.maybe_complete_join_phase()

    def reset_and_propagate_assignment(self, error: ServiceError) -> None:
        invariant(self.state is ClassicGroupState.COMPLETING_REBALANCE,
                  lambda: f"{self.where()}: resetting assignments in state {self.state.value}")
        for member_id, member in list(self.members.items()):
            self.members[member_id] = replace(member, assignment=b"")
        self.propagate_assignment(error)

    def propagate_assignment(self, error: ServiceError | None) -> None:
        for member_id in list(self.members):
            member = self.members[member_id]
            reply = SyncReply(error=error, assignment=member.assignment) if error else SyncReply(
                protocol_type=self.protocol_type, protocol_name=self.protocol_name,
                assignment=member.assignment)
            if self.complete_sync(member_id, reply):
                # The session restarts once the member has its answer: while
                # its call was parked no timer ran for it.
                self.reschedule(member_id)

    def remove_member_and_update(self, member_id: str) -> None:
        self.remove(member_id)
        if self.state in (ClassicGroupState.STABLE, ClassicGroupState.COMPLETING_REBALANCE):
            self.maybe_prepare_rebalance_or_complete_join()
        elif (self.state is ClassicGroupState.PREPARING_REBALANCE
              and self.has_all_members_joined()):
            self.complete_join_phase()

    def add_member_then_rebalance(self, member: ClassicMember) -> None:
        if (self.state is ClassicGroupState.PREPARING_REBALANCE
                and self.previous_state is ClassicGroupState.EMPTY):
            self.new_member_added = True
        self.add(member)
        self.maybe_prepare_rebalance_or_complete_join()


# ------------------------------------------------------------ group lookups


def _fresh(group_id: str) -> ClassicGroup:
    return ClassicGroup(group_id=group_id)


def _unknown_group(group_id: str, current: AnyGroup | None, member_id: str,
                   operation: str) -> ServiceError:
    if isinstance(current, Group):
        return _error(ErrorCode.UNKNOWN_MEMBER_ID,
                      f"group {group_id!r} is a consumer group (ConsumerGroupHeartbeat), not a "
                      f"classic one; it has no classic member {member_id!r} ({operation})")
    return _error(ErrorCode.UNKNOWN_MEMBER_ID,
                  f"group {group_id!r} does not exist; it has no member {member_id!r} "
                  f"({operation})")


def member_id_for(prefix: str, suffix: str) -> str:
    """Kafka's member ids: the instance id (static) or the client id, a dash,
    a unique suffix; the prefix cut so that the id stays within the id
    length limit (an id over it would be refused in the member's next call)."""
    room = limits.MAX_ID_LENGTH - len(suffix) - 1
    return f"{prefix[:max(room, 0)]}-{suffix}"


# -------------------------------------------------------------- JoinGroup


def plan_join(current: AnyGroup | None, *, group_id: str, member_id: str, instance_id: str,
              protocol_type: str, protocols: Sequence[Protocol], session_timeout_ms: int,
              rebalance_timeout_ms: int, client_id: str, client_host: str,
              require_known_member_id: bool, new_member_suffix: str, now_ms: int,
              config: ClassicConfig) -> Outcome[JoinReply]:
    """One JoinGroup (Kafka's classicGroupJoin). Raises ServiceError for bad
    input (INVALID_SESSION_TIMEOUT, INVALID_REQUEST); the group protocol's
    refusals are answers. `new_member_suffix` (unique) makes a new member's id."""
    if not config.min_session_timeout_ms <= session_timeout_ms <= config.max_session_timeout_ms:
        raise ServiceError(
            ErrorCode.INVALID_SESSION_TIMEOUT,
            f"session_timeout_ms {session_timeout_ms} is outside the coordinator's range "
            f"{config.min_session_timeout_ms}..{config.max_session_timeout_ms}",
        )
    # JoinGroup v0 has no rebalance timeout: the session timeout stands in.
    rebalance_ms = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms
    protocols = tuple(protocols)
    names = frozenset(p.name for p in protocols)
    if isinstance(current, Group) and current.members:
        return Outcome(group=None, reply=JoinReply(member_id=member_id, error=_error(
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            f"group {group_id!r} is a consumer group with {len(current.members)} member(s) "
            "(ConsumerGroupHeartbeat, server-side assignment); a classic member cannot join "
            "it until it is empty")))
    # An empty group of the other type becomes a classic one.
    base = current if isinstance(current, ClassicGroup) else _fresh(group_id)
    if member_id and not isinstance(current, ClassicGroup):
        return Outcome(group=None, reply=JoinReply(member_id=member_id, error=_unknown_group(
            group_id, current, member_id, "JoinGroup")))
    s = _Scratch(base, now_ms, config)
    if s.state is ClassicGroupState.DEAD:
        reply = JoinReply(member_id=member_id, error=_error(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group_id!r} is being removed"))
        return Outcome(group=None, reply=reply)
    if not s.supports_protocols(protocol_type, names):
        return Outcome(group=None, reply=JoinReply(member_id=member_id, error=_error(
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            _inconsistent(s, protocol_type, names))))
    new = ClassicMember(
        member_id="", instance_id=instance_id, client_id=client_id, client_host=client_host,
        rebalance_timeout_ms=rebalance_ms, session_timeout_ms=session_timeout_ms,
        protocol_type=protocol_type, protocols=protocols, awaiting_join=True, is_new=True,
        deadline_ms=now_ms + config.new_member_join_timeout_ms,
    )
    if not member_id:
        new_id = member_id_for(instance_id or client_id, new_member_suffix)
        return _join_new_member(s, base, replace(new, member_id=new_id),
                                require_known_member_id)
    return _join_existing_member(s, base, replace(new, member_id=member_id))


def _shown(names: frozenset[str]) -> str:
    """Protocol names for a message: a few of them (a member may send many)."""
    ordered = sorted(names)
    more = f" and {len(ordered) - 5} more" if len(ordered) > 5 else ""
    return f"{ordered[:5]}{more}"


def _inconsistent(s: _Scratch, protocol_type: str, names: frozenset[str]) -> str:
    if s.state is ClassicGroupState.EMPTY:
        return (f"group {s.group_id!r}: a member must name a protocol type and at least one "
                f"protocol (got type {protocol_type!r}, protocols {_shown(names)})")
    if protocol_type != s.protocol_type:
        return (f"group {s.group_id!r} has protocol type {s.protocol_type!r}; the member's is "
                f"{protocol_type!r}")
    return (f"group {s.group_id!r}: none of the member's protocols {_shown(names)} is "
            "supported by every member of the group")


def _settled(s: _Scratch, base: ClassicGroup, member_id: str) -> Outcome[JoinReply]:
    """The outcome of a join that parked the caller: its answer now if this
    very step completed the join phase, else it waits."""
    reply = s.join_replies.pop(member_id, None)
    out = s.outcome(reply, member_id)
    return out if out.group != base or out.reply is not None else replace(out, group=None)


def _join_new_member(s: _Scratch, base: ClassicGroup, member: ClassicMember,
                     require_known_member_id: bool) -> Outcome[JoinReply]:
    if member.instance_id:
        existing = s.static_member_id(member.instance_id)
        if existing is not None:
            return _replace_static_member(s, base, existing, member)
        s.add_member_then_rebalance(member)
        return _settled(s, base, member.member_id)
    if require_known_member_id:
        # KIP-394: the id goes back to the client, which joins again with it;
        # until then the rebalance waits for it too (at most its session).
        s.pending_members[member.member_id] = s.now_ms + member.session_timeout_ms
        return s.outcome(JoinReply(member_id=member.member_id, error=_error(
            ErrorCode.MEMBER_ID_REQUIRED,
            f"group {s.group_id!r}: join again with member id {member.member_id!r}")))
    s.add_member_then_rebalance(member)
    return _settled(s, base, member.member_id)


def _replace_static_member(s: _Scratch, base: ClassicGroup, old_id: str,
                           member: ClassicMember) -> Outcome[JoinReply]:
    """A known static member joins without a member id (it restarted): Kafka's
    updateStaticMemberThenRebalanceOrCompleteJoin."""
    new_id = member.member_id
    leader_before = s.leader_id
    s.replace_static_member(member.instance_id, old_id, new_id)
    s.reschedule(new_id)
    s.update_member(new_id, member.protocols, member.rebalance_timeout_ms,
                    member.session_timeout_ms)
    s.set_member(replace(s.members[new_id], client_id=member.client_id,
                         client_host=member.client_host))
    if s.state is ClassicGroupState.STABLE:
        if s.protocol_name == s.select_protocol():
            # Nothing the assignment depends on changed: no rebalance. The
            # new member id is written (so a restarted coordinator fences the
            # old one too), and the member is answered as a follower of the
            # generation (the leader named is the one before the restart, so
            # a restarted leader does not compute a new assignment), which
            # its SyncGroup then gets.
            s.persist = True
            s.complete_join(new_id, s.join_answer(new_id, leader=leader_before,
                                                  with_members=False))
            return _settled(s, base, new_id)
        s.maybe_prepare_rebalance_or_complete_join()
    elif s.state is ClassicGroupState.COMPLETING_REBALANCE:
        # The leader may already be assigning to the old member id: start over.
        s.prepare_rebalance()
    else:
        invariant(s.state is ClassicGroupState.PREPARING_REBALANCE,
                  lambda: f"group {s.group_id!r}: static member {member.instance_id!r} known "
                          f"in state {s.state.value}")
        s.maybe_complete_join_phase()
    return _settled(s, base, new_id)


def _join_existing_member(s: _Scratch, base: ClassicGroup,
                          member: ClassicMember) -> Outcome[JoinReply]:
    member_id = member.member_id
    if member_id in s.pending_members:
        if member.instance_id:
            # Pending ids are handed out to dynamic members only.
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"group {s.group_id!r}: member id {member_id!r} was handed to a dynamic member; "
                f"it cannot join with group instance id {member.instance_id!r}",
            )
        s.add_member_then_rebalance(member)
        return _settled(s, base, member_id)
    error = s.validate_member(member_id, member.instance_id, "JoinGroup")
    if error is not None:
        return Outcome(group=None, reply=JoinReply(member_id=member_id, error=error))
    known = s.member(member_id)
    same_protocols = known.protocols == member.protocols
    if s.state is ClassicGroupState.PREPARING_REBALANCE:
        _update_then_rebalance(s, known, member)
    elif s.state is ClassicGroupState.COMPLETING_REBALANCE:
        if same_protocols:
            # A retry of a JoinGroup whose answer was lost: the generation's
            # answer again.
            return Outcome(group=None, reply=s.join_answer(member_id))
        _update_then_rebalance(s, known, member)
    elif s.state is ClassicGroupState.STABLE:
        if s.is_leader(member_id) or not same_protocols:
            # The leader rejoins to reassign (topic metadata changed, say).
            _update_then_rebalance(s, known, member)
        else:
            return Outcome(group=None, reply=s.join_answer(member_id, with_members=False))
    else:
        return Outcome(group=None, reply=JoinReply(member_id=member_id, error=_error(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"group {s.group_id!r} is {s.state.value}; member {member_id!r} must join again "
            "without a member id")))
    return _settled(s, base, member_id)


def _update_then_rebalance(s: _Scratch, known: ClassicMember, member: ClassicMember) -> None:
    s.update_member(known.member_id, member.protocols, member.rebalance_timeout_ms,
                    member.session_timeout_ms)
    s.maybe_prepare_rebalance_or_complete_join()


# -------------------------------------------------------------- SyncGroup


def plan_sync(current: AnyGroup | None, *, group_id: str, member_id: str, instance_id: str,
              generation_id: int, protocol_type: str, protocol_name: str,
              assignments: Sequence[tuple[str, bytes]], now_ms: int,
              config: ClassicConfig) -> Outcome[SyncReply]:
    """One SyncGroup (Kafka's classicGroupSync). The leader's, in
    CompletingRebalance, stores the assignment (`persist`) and answers every
    parked SyncGroup; a follower's waits for it."""
    if not isinstance(current, ClassicGroup) or current.is_empty:
        error = (_unknown_group(group_id, current, member_id, "SyncGroup")
                 if not isinstance(current, ClassicGroup) else _error(
                     ErrorCode.UNKNOWN_MEMBER_ID,
                     f"group {group_id!r} is Empty; member {member_id!r} must join first"))
        return Outcome(group=None, reply=SyncReply(error=error))
    s = _Scratch(current, now_ms, config)
    refused = _check_sync(s, member_id, instance_id, generation_id, protocol_type, protocol_name)
    if refused is not None:
        return Outcome(group=None, reply=SyncReply(error=refused))
    if s.state is ClassicGroupState.PREPARING_REBALANCE:
        return Outcome(group=None, reply=SyncReply(error=_error(
            ErrorCode.REBALANCE_IN_PROGRESS,
            f"group {group_id!r} is rebalancing; member {member_id!r} must join again")))
    if s.state is ClassicGroupState.STABLE:
        s.pending_sync.discard(member_id)
        if not s.pending_sync:
            s.sync_deadline_ms = -1
        reply = SyncReply(protocol_type=s.protocol_type, protocol_name=s.protocol_name,
                          assignment=s.member(member_id).assignment)
        out = s.outcome(reply)
        return out if out.group != current else replace(out, group=None)
    # CompletingRebalance: park the call; the leader's carries the assignment.
    s.set_member(replace(s.member(member_id), awaiting_sync=True))
    s.pending_sync.discard(member_id)
    if not s.pending_sync:
        s.sync_deadline_ms = -1
    if s.is_leader(member_id):
        given = dict(assignments)
        for mid in list(s.members):
            s.set_member(replace(s.members[mid], assignment=given.get(mid, b"")))
        s.persist = True
        s.propagate_assignment(None)
        s.transition_to(ClassicGroupState.STABLE)
    answered = s.sync_replies.pop(member_id, None)
    return s.outcome(answered, member_id)


def _check_sync(s: _Scratch, member_id: str, instance_id: str, generation_id: int,
                protocol_type: str, protocol_name: str) -> ServiceError | None:
    if s.state is ClassicGroupState.DEAD:
        return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{s.where()} is being removed")
    error = s.validate_member(member_id, instance_id, "SyncGroup")
    if error is not None:
        return error
    if generation_id != s.generation_id:
        return _error(ErrorCode.ILLEGAL_GENERATION,
                      f"{s.where()}: member {member_id!r} sent SyncGroup for generation "
                      f"{generation_id}; the group's is {s.generation_id}")
    for given, group_value, what in ((protocol_type, s.protocol_type, "protocol type"),
                                     (protocol_name, s.protocol_name, "protocol name")):
        if given and group_value and given != group_value:
            return _error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                          f"{s.where()}: member {member_id!r} sent {what} {given!r}; the "
                          f"group's is {group_value!r}")
    return None


def plan_sync_write_failed(group: ClassicGroup, error: ServiceError, *, now_ms: int,
                           config: ClassicConfig) -> Outcome[None]:
    """The leader's assignment could not be written, and memory is still the
    log's (the store refused it whole): as Kafka, every parked SyncGroup gets
    the error and the group rebalances."""
    if group.state is not ClassicGroupState.COMPLETING_REBALANCE:
        return Outcome(group=None)
    s = _Scratch(group, now_ms, config)
    # Kafka's mapping of a failed group write to a SyncGroup answer: what a
    # client can act on (rejoin after finding the coordinator again).
    code = {ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
            ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
            ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
            ErrorCode.STORAGE_ERROR: ErrorCode.NOT_COORDINATOR}.get(error.code, error.code)
    s.reset_and_propagate_assignment(_error(
        code, f"{s.where()}: the assignment of generation {s.generation_id} could not be "
              f"stored: {error.message}"))
    s.maybe_prepare_rebalance_or_complete_join()
    return s.outcome(None)


# -------------------------------------------------------------- Heartbeat


def plan_heartbeat(current: AnyGroup | None, *, group_id: str, member_id: str,
                   instance_id: str, generation_id: int, now_ms: int,
                   config: ClassicConfig) -> Outcome[HeartbeatReply]:
    """One Heartbeat of the classic protocol: renews the member's session;
    REBALANCE_IN_PROGRESS tells it to rejoin."""
    if not isinstance(current, ClassicGroup):
        return Outcome(group=None, reply=HeartbeatReply(
            _unknown_group(group_id, current, member_id, "Heartbeat")))
    s = _Scratch(current, now_ms, config)
    if s.state is ClassicGroupState.DEAD:
        return Outcome(group=None, reply=HeartbeatReply(_error(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{s.where()} is being removed")))
    error = s.validate_member(member_id, instance_id, "Heartbeat")
    if error is None and generation_id != s.generation_id:
        error = _error(ErrorCode.ILLEGAL_GENERATION,
                       f"{s.where()}: member {member_id!r} sent a heartbeat for generation "
                       f"{generation_id}; the group's is {s.generation_id}")
    if error is not None:
        return Outcome(group=None, reply=HeartbeatReply(error))
    s.reschedule(member_id)
    if s.state is ClassicGroupState.PREPARING_REBALANCE:
        return s.outcome(HeartbeatReply(_error(
            ErrorCode.REBALANCE_IN_PROGRESS,
            f"{s.where()} is rebalancing (generation {s.generation_id}); join again")))
    return s.outcome(HeartbeatReply())


# ------------------------------------------------------------- LeaveGroup


def plan_leave(current: AnyGroup | None, *, group_id: str, members: Sequence[LeavingMember],
               now_ms: int, config: ClassicConfig) -> Outcome[tuple[LeaveResult, ...]]:
    """One LeaveGroup (Kafka's classicGroupLeave): an answer per member; the
    members that left start a rebalance."""
    if not isinstance(current, ClassicGroup):
        return Outcome(group=None, reply=tuple(
            LeaveResult(m.member_id, m.instance_id,
                        _unknown_group(group_id, current, m.member_id, "LeaveGroup"))
            for m in members))
    s = _Scratch(current, now_ms, config)
    if s.state is ClassicGroupState.DEAD:
        raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{s.where()} is being removed")
    results: list[LeaveResult] = []
    for leaving in members:
        error: ServiceError | None = None
        if not leaving.member_id:
            # An operator's removal of a static member by its instance id.
            holder = s.static_member_id(leaving.instance_id)
            if holder is None:
                error = _error(ErrorCode.UNKNOWN_MEMBER_ID,
                               f"{s.where()} has no static member with group instance id "
                               f"{leaving.instance_id!r}")
            else:
                s.remove(holder)
        elif leaving.member_id in s.pending_members:
            s.remove(leaving.member_id)
        else:
            error = s.validate_member(leaving.member_id, leaving.instance_id, "LeaveGroup")
            if error is None:
                s.remove(leaving.member_id)
        results.append(LeaveResult(leaving.member_id, leaving.instance_id, error))
    if any(r.error is None for r in results):
        if s.state in (ClassicGroupState.STABLE, ClassicGroupState.COMPLETING_REBALANCE):
            s.maybe_prepare_rebalance_or_complete_join()
        elif s.state is ClassicGroupState.PREPARING_REBALANCE:
            s.maybe_complete_join_phase()
    out = s.outcome(tuple(results))
    return out if out.group != current else replace(out, group=None)


# ------------------------------------------------------------------ timers


def plan_tick(group: ClassicGroup, *, now_ms: int, config: ClassicConfig) -> Outcome[None]:
    """Acts on every deadline of the group that has passed, in deadline
    order: the join phase's end (or the initial delay's extension), the
    end of the wait for SyncGroups, and sessions (a member's, or a pending
    member's second JoinGroup)."""
    s = _Scratch(group, now_ms, config)
    due: list[tuple[int, int, str]] = []
    if group.join_timer is not None and group.join_timer.deadline_ms <= now_ms:
        due.append((group.join_timer.deadline_ms, 0, ""))
    if 0 <= group.sync_deadline_ms <= now_ms:
        due.append((group.sync_deadline_ms, 1, ""))
    due.extend((m.deadline_ms, 2, m.member_id) for m in group.members.values()
               if 0 <= m.deadline_ms <= now_ms)
    due.extend((deadline, 2, member_id) for member_id, deadline in group.pending_members.items()
               if deadline <= now_ms)
    for _deadline, kind, member_id in sorted(due):
        if kind == 0:
            timer = s.join_timer
            if timer is None or timer.deadline_ms > now_ms:
                continue  # replaced by an earlier step of this tick
            if timer.initial:
                s.try_complete_initial_rebalance(timer)
            else:
                s.complete_join_phase()
        elif kind == 1:
            if not 0 <= s.sync_deadline_ms <= now_ms:
                continue
            s.sync_deadline_ms = -1
            if (s.state in (ClassicGroupState.COMPLETING_REBALANCE, ClassicGroupState.STABLE)
                    and s.pending_sync):
                # Members that got their JoinGroup answer but never sent
                # SyncGroup are gone: remove them and rebalance.
                for gone in sorted(s.pending_sync):
                    s.remove(gone)
                s.prepare_rebalance()
        else:
            _expire_session(s, member_id)
    out: Outcome[None] = s.outcome(None)
    return out if out.group != group else replace(out, group=None)


def _expire_session(s: _Scratch, member_id: str) -> None:
    if member_id in s.pending_members:
        if s.pending_members[member_id] > s.now_ms:
            return
        s.remove(member_id)
        if (s.state is ClassicGroupState.PREPARING_REBALANCE
                and s.has_all_members_joined()):
            s.complete_join_phase()
        return
    member = s.members.get(member_id)
    if member is None or not 0 <= member.deadline_ms <= s.now_ms:
        return
    if member.has_satisfied_heartbeat:
        # A parked call stands in for heartbeats; the session restarts when
        # it is answered.
        s.set_member(replace(member, deadline_ms=-1))
        return
    s.remove_member_and_update(member_id)


def start_sessions(group: ClassicGroup, *, now_ms: int) -> ClassicGroup:
    """A loaded group's members each get a full session (deadlines are not
    in the record)."""
    return replace(group, members={
        mid: replace(m, deadline_ms=now_ms + m.session_timeout_ms)
        for mid, m in group.members.items()
    })


# ----------------------------------------------------------------- offsets


def check_offset_commit(group: ClassicGroup, *, member_id: str, instance_id: str,
                        generation_id: int, transactional: bool) -> None:
    """Who may commit a classic group's offsets (Kafka's ClassicGroup
    validateOffsetCommit); raises ServiceError. Generation -1 without a
    member id commits outside the group protocol: accepted while the group
    is Empty, and for transactional commits always (older producers send no
    member id). A member's commit needs the current generation, and is
    refused with REBALANCE_IN_PROGRESS while the group waits for its leader's
    assignment (transactional ones are not)."""
    where = f"group {group.group_id!r}"
    if group.state is ClassicGroupState.DEAD:
        raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{where} is being removed")
    if generation_id < 0 and group.is_empty:
        return
    if generation_id >= 0 or member_id or instance_id:
        error = validate_member(group.group_id, group.members, member_id, instance_id,
                                "TxnOffsetCommit" if transactional else "OffsetCommit")
        if error is not None:
            raise error
        if generation_id != group.generation_id:
            raise ServiceError(
                ErrorCode.ILLEGAL_GENERATION,
                f"{where}: member {member_id!r} committed with generation {generation_id}; the "
                f"group's is {group.generation_id}",
            )
    elif not transactional:
        raise ServiceError(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"{where} has {len(group.members)} member(s) ({group.state.value}); a commit "
            "without member id and generation is accepted only while it is Empty",
        )
    if not transactional and group.state is ClassicGroupState.COMPLETING_REBALANCE:
        raise ServiceError(
            ErrorCode.REBALANCE_IN_PROGRESS,
            f"{where} is waiting for the assignment of generation {group.generation_id}; "
            f"commit again after SyncGroup (member {member_id!r})",
        )


# ------------------------------------------------------------ group types


def consumer_group_or_none(current: AnyGroup | None, group_id: str) -> Group | None:
    """The server-assigned group a ConsumerGroupHeartbeat acts on: an empty
    classic group may change type (None: a new group); a classic group with
    members refuses it with GROUP_ID_NOT_FOUND, as Kafka does when a group
    is not a consumer group and no conversion applies."""
    if not isinstance(current, ClassicGroup):
        return current
    if current.is_empty:
        return None
    raise ServiceError(
        ErrorCode.GROUP_ID_NOT_FOUND,
        f"group {group_id!r} is a classic group (JoinGroup/SyncGroup) with "
        f"{len(current.members)} member(s), {current.state.value}; it is not a consumer "
        "group until it is empty",
    )


def in_use(group: AnyGroup | None) -> bool:
    """Whether the group has members (or, classic, is not Empty): what
    DeleteGroups and retention refuse to remove."""
    if group is None:
        return False
    if isinstance(group, ClassicGroup):
        return not group.is_empty
    return bool(group.members)


# ------------------------------------------------------------------ record


def snapshot(group: ClassicGroup) -> dict[str, Any]:
    """The group's record payload: Kafka's GroupMetadataValue, field for
    field (bytes as base64)."""
    invariant(not group.members or bool(group.protocol_name),
              lambda: f"group {group.group_id!r}: members without a selected protocol cannot "
                      "be stored")
    return {
        "type": RECORD_TYPE,
        "protocol_type": group.protocol_type,
        "generation": group.generation_id,
        "protocol": group.protocol_name or None,
        "leader": group.leader_id or None,
        "current_state_timestamp": group.state_timestamp_ms,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id or None,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "rebalance_timeout": m.rebalance_timeout_ms,
                "session_timeout": m.session_timeout_ms,
                "subscription": _b64(m.metadata(group.protocol_name)),
                "assignment": _b64(m.assignment),
            }
            for m in group.members.values()
        ],
    }


def is_classic_payload(payload: Mapping[str, Any]) -> bool:
    return payload.get("type") == RECORD_TYPE


def from_snapshot(group_id: str, payload: Mapping[str, Any]) -> ClassicGroup:
    """The group a record describes: Stable with its members, or Empty; its
    members' only protocol is the group's (what they last joined with)."""
    protocol_type = str(payload["protocol_type"])
    protocol_name = str(payload.get("protocol") or "")
    members = {}
    for m in payload["members"]:
        member = ClassicMember(
            member_id=str(m["member_id"]), instance_id=str(m.get("group_instance_id") or ""),
            client_id=str(m["client_id"]), client_host=str(m["client_host"]),
            rebalance_timeout_ms=int(m["rebalance_timeout"]),
            session_timeout_ms=int(m["session_timeout"]), protocol_type=protocol_type,
            protocols=(Protocol(protocol_name, _unb64(m["subscription"])),),
            assignment=_unb64(m["assignment"]),
        )
        members[member.member_id] = member
    state = ClassicGroupState.STABLE if members else ClassicGroupState.EMPTY
    return ClassicGroup(
        group_id=group_id, generation_id=int(payload["generation"]),
        protocol_type=protocol_type, protocol_name=protocol_name,
        leader_id=str(payload.get("leader") or ""), members=members, state=state,
        previous_state=state, state_timestamp_ms=int(payload.get("current_state_timestamp", -1)),
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    return base64.b64decode(str(text).encode("ascii"), validate=True)


def members_description(group: ClassicGroup) -> Iterable[tuple[ClassicMember, bytes]]:
    """Each member with the metadata DescribeGroups shows: that of the
    selected protocol while Stable, none otherwise (as Kafka)."""
    for member in group.members.values():
        metadata = (member.metadata(group.protocol_name)
                    if group.state is ClassicGroupState.STABLE else b"")
        yield member, metadata
