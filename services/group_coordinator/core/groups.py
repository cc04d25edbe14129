"""Consumer group membership: the state of a group and the rules that change it.

Pure values and functions (docs/groups.md is the contract). The runtime asks
a planner for the group after a request; if it differs from the current one
it is persisted to `__consumer_offsets` first and only then replayed into
memory, so the state after a restart is the state before it.

Per member the coordinator keeps two sets:

* `target` — what the assignor wants the member to own (recomputed whenever
  the group epoch moves);
* `owned` — what the coordinator has handed to the member and the member has
  not yet given back. A partition enters `owned` only when no other member
  has it in `owned` (revocation before reassignment), and leaves it when the
  member acknowledges the revocation (a heartbeat without it) or the member
  is removed. So `owned` sets are always disjoint: no partition ever has two
  owners, in any generation.

The answer to a heartbeat is `owned ∩ target`: partitions in `owned` but not
in `target` are left out, which tells the member to revoke them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from oncelog.wire.errors import ErrorCode
from oncelog.wire.vocabulary import GroupState as WireGroupState

from ...common.kernel.errors import ServiceError
from .assignor import TP, assign

# Heartbeat member epochs with a special meaning (docs/groups.md).
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


# The values are the wire's shared vocabulary (oncelog.wire.vocabulary), the
# names DescribeTransactions/DescribeGroups report.
class GroupState(enum.StrEnum):
    EMPTY = WireGroupState.EMPTY.value
    RECONCILING = WireGroupState.RECONCILING.value
    STABLE = WireGroupState.STABLE.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    member_id: str
    instance_id: str = ""
    topics: frozenset[str] = frozenset()
    session_timeout_ms: int = 10_000
    member_epoch: int = 0
    owned: frozenset[TP] = frozenset()
    target: frozenset[TP] = frozenset()
    # A static member that left with epoch -2: kept (with its partitions)
    # until its session times out or it rejoins.
    left_temporarily: bool = False

    @property
    def assignment(self) -> frozenset[TP]:
        """What the member may own now (the heartbeat's answer)."""
        return self.owned & self.target

    @property
    def reconciled(self) -> bool:
        return self.owned == self.target

    def to_payload(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "instance_id": self.instance_id,
            "topics": sorted(self.topics),
            "session_timeout_ms": self.session_timeout_ms,
            "member_epoch": self.member_epoch,
            "owned": sorted([t, p] for t, p in self.owned),
            "target": sorted([t, p] for t, p in self.target),
            "left_temporarily": self.left_temporarily,
        }

    @staticmethod
    def from_payload(payload: Mapping[str, Any]) -> Member:
        return Member(
            member_id=str(payload["member_id"]),
            instance_id=str(payload.get("instance_id", "")),
            topics=frozenset(payload["topics"]),
            session_timeout_ms=int(payload["session_timeout_ms"]),
            member_epoch=int(payload["member_epoch"]),
            owned=frozenset((str(t), int(p)) for t, p in payload["owned"]),
            target=frozenset((str(t), int(p)) for t, p in payload["target"]),
            left_temporarily=bool(payload.get("left_temporarily", False)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    group_id: str
    # Moves on every change of membership, subscriptions or partition counts.
    epoch: int = 0
    members: Mapping[str, Member] = field(default_factory=dict)
    # Partition counts of the subscribed topics the current targets were
    # computed from; a change (topic created, grown or deleted) retargets.
    partition_counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if all(m.reconciled and m.member_epoch == self.epoch for m in self.members.values()):
            return GroupState.STABLE
        return GroupState.RECONCILING

    @property
    def subscribed_topics(self) -> frozenset[str]:
        return frozenset(t for m in self.members.values() for t in m.topics)

    def member_by_instance(self, instance_id: str) -> Member | None:
        if not instance_id:
            return None
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def owner_of(self, tp: TP) -> str | None:
        for m in self.members.values():
            if tp in m.owned:
                return m.member_id
        return None

    def to_payload(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "members": [m.to_payload() for _, m in sorted(self.members.items())],
            "partition_counts": dict(sorted(self.partition_counts.items())),
        }

    @staticmethod
    def from_payload(group_id: str, payload: Mapping[str, Any]) -> Group:
        members = [Member.from_payload(m) for m in payload["members"]]
        return Group(
            group_id=group_id,
            epoch=int(payload["epoch"]),
            members={m.member_id: m for m in members},
            partition_counts={str(k): int(v) for k, v in payload["partition_counts"].items()},
        )


def empty_group(group_id: str) -> Group:
    return Group(group_id=group_id)


# ----------------------------------------------------------------- planners


def retarget(group: Group, partition_counts: Mapping[str, int]) -> Group:
    """Bumps the group epoch and computes new targets (sticky to the current
    ones), then hands out what is free. `partition_counts` must cover every
    subscribed topic (a missing or deleted topic counts as 0 partitions)."""
    counts = {t: partition_counts.get(t, 0) for t in sorted(group.subscribed_topics)}
    targets = assign(
        {m.member_id: m.topics for m in group.members.values()},
        {m.member_id: m.target for m in group.members.values()},
        counts,
    )
    members = {mid: replace(m, target=targets.get(mid, frozenset()))
               for mid, m in group.members.items()}
    regrouped = replace(group, epoch=group.epoch + 1, members=members, partition_counts=counts)
    return _grant_all(regrouped)


def needs_retarget(group: Group, partition_counts: Mapping[str, int]) -> bool:
    """Has a subscribed topic's partition count changed since the targets?"""
    if not group.members:
        return False
    return any(partition_counts.get(t, 0) != group.partition_counts.get(t, 0)
               for t in group.subscribed_topics)


def _grant(group: Group, member_id: str) -> Group:
    """Hands the member every target partition no other member owns, and
    moves its epoch to the group's once it owns exactly its target."""
    member = group.members[member_id]
    taken = {tp for m in group.members.values() if m.member_id != member_id for tp in m.owned}
    owned = member.owned | frozenset(tp for tp in member.target if tp not in taken)
    # A joining member gets the group's epoch at once even before it owns
    # its target: epoch 0 in a heartbeat means "join", so a member must never
    # be left at 0 while it owns partitions.
    epoch = group.epoch if owned == member.target or member.member_epoch == 0 \
        else member.member_epoch
    if owned == member.owned and epoch == member.member_epoch:
        return group
    members = dict(group.members)
    members[member_id] = replace(member, owned=owned, member_epoch=epoch)
    return replace(group, members=members)


def _grant_all(group: Group) -> Group:
    for member_id in sorted(group.members):
        group = _grant(group, member_id)
    return group


def _remove(group: Group, member_id: str) -> Group:
    members = dict(group.members)
    del members[member_id]
    return replace(group, members=members)


def _check_session_timeout(session_timeout_ms: int, *, min_ms: int, max_ms: int) -> None:
    if not min_ms <= session_timeout_ms <= max_ms:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"session_timeout_ms {session_timeout_ms} is outside the coordinator's range "
            f"{min_ms}..{max_ms}",
        )


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    group: Group
    member_id: str


def plan_heartbeat(
    group: Group | None,
    *,
    group_id: str,
    member_id: str,
    member_epoch: int,
    instance_id: str,
    topics: Iterable[str],
    session_timeout_ms: int,
    owned_partitions: Iterable[TP],
    new_member_id: str,
    partition_counts: Mapping[str, int],
    min_session_timeout_ms: int,
    max_session_timeout_ms: int,
) -> HeartbeatResult:
    """The group after one ConsumerGroupHeartbeat (docs/groups.md). Raises
    ServiceError for a refused request; a refused request changes nothing.
    `new_member_id` is used when a member joins without an id;
    `partition_counts` must cover the subscribed topics."""
    if not group_id:
        raise ServiceError(ErrorCode.INVALID_GROUP_ID, "group_id must not be empty")
    group = group or empty_group(group_id)
    topics = frozenset(topics)
    if member_epoch == JOIN_EPOCH:
        _check_session_timeout(session_timeout_ms, min_ms=min_session_timeout_ms,
                               max_ms=max_session_timeout_ms)
        if not topics:
            raise ServiceError(ErrorCode.INVALID_REQUEST,
                               "a member must subscribe to at least one topic to join")
        return _join(group, member_id or new_member_id, instance_id, topics,
                     session_timeout_ms, partition_counts)
    member = group.members.get(member_id) if member_id else None
    if member is None:
        holder = group.member_by_instance(instance_id)
        if holder is not None:
            raise ServiceError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"group {group_id!r}: instance {instance_id!r} is now member "
                f"{holder.member_id!r}; member {member_id!r} was replaced",
            )
        raise ServiceError(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"group {group_id!r} has no member {member_id!r} (removed after its session "
            "timed out, or it left); rejoin with member_epoch 0",
        )
    if member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
        if member_epoch == STATIC_LEAVE_EPOCH and member.instance_id:
            members = dict(group.members)
            members[member_id] = replace(member, left_temporarily=True)
            return HeartbeatResult(replace(group, members=members), member_id)
        return HeartbeatResult(retarget(_remove(group, member_id), partition_counts), member_id)
    if member_epoch < 0 or member_epoch > member.member_epoch:
        raise ServiceError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"group {group_id!r}: member {member_id!r} sent epoch {member_epoch}, but its "
            f"epoch is {member.member_epoch}; rejoin with member_epoch 0",
        )
    # Acknowledged revocations: owned partitions outside the target that the
    # member no longer reports. (Partitions of its target it does not report
    # yet stay owned: the answer granting them may not have reached it.)
    reported = frozenset(owned_partitions)
    owned = frozenset(tp for tp in member.owned if tp in member.target or tp in reported)
    updated = replace(member, owned=owned, left_temporarily=False)
    members = dict(group.members)
    members[member_id] = updated
    group = replace(group, members=members)
    if topics and topics != member.topics:
        members[member_id] = replace(updated, topics=topics)
        return HeartbeatResult(retarget(replace(group, members=members), partition_counts),
                               member_id)
    if needs_retarget(group, partition_counts):
        return HeartbeatResult(retarget(group, partition_counts), member_id)
    # Released partitions may let others (and this member) take theirs now.
    return HeartbeatResult(_grant_all(group), member_id)


def _join(group: Group, member_id: str, instance_id: str, topics: frozenset[str],
          session_timeout_ms: int, partition_counts: Mapping[str, int]) -> HeartbeatResult:
    previous = group.member_by_instance(instance_id)
    if previous is not None and previous.topics == topics:
        # Static membership: the new process takes the old one's place and
        # its partitions, without a rebalance (the group epoch stays).
        members = dict(group.members)
        del members[previous.member_id]
        members[member_id] = replace(
            previous, member_id=member_id, session_timeout_ms=session_timeout_ms,
            left_temporarily=False,
        )
        return HeartbeatResult(replace(group, members=members), member_id)
    members = dict(group.members)
    if previous is not None:
        del members[previous.member_id]
    members.pop(member_id, None)
    members[member_id] = Member(
        member_id=member_id, instance_id=instance_id, topics=topics,
        session_timeout_ms=session_timeout_ms,
    )
    return HeartbeatResult(retarget(replace(group, members=members), partition_counts), member_id)


def plan_remove_members(group: Group, member_ids: Iterable[str],
                        partition_counts: Mapping[str, int]) -> Group:
    """Members whose session timed out leave; the rest rebalance."""
    gone = [m for m in member_ids if m in group.members]
    if not gone:
        return group
    for member_id in gone:
        group = _remove(group, member_id)
    return retarget(group, partition_counts)


# ------------------------------------------------------------ offset checks


def check_commit_member(group: Group | None, *, group_id: str, member_id: str,
                        generation_id: int, partitions: Iterable[TP]) -> dict[TP, ServiceError]:
    """Who may commit offsets (docs/groups.md): raises for request-level
    refusals and returns per-partition ones (empty: all accepted)."""
    if not member_id and generation_id < 0:
        if group is not None and group.members:
            raise ServiceError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"group {group_id!r} has {len(group.members)} active member(s); a commit "
                "without member id and generation is accepted only for a group without "
                "members",
            )
        return {}
    if group is None:
        raise ServiceError(ErrorCode.GROUP_ID_NOT_FOUND,
                           f"group {group_id!r} does not exist (member {member_id!r})")
    member = group.members.get(member_id)
    if member is None:
        raise ServiceError(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"group {group_id!r} has no member {member_id!r}; it was removed (session "
            "timeout) or left",
        )
    if generation_id > member.member_epoch or generation_id < 0:
        raise ServiceError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"group {group_id!r}: member {member_id!r} committed with generation "
            f"{generation_id}, but its epoch is {member.member_epoch}",
        )
    return {
        tp: ServiceError(
            ErrorCode.STALE_MEMBER_EPOCH,
            f"group {group_id!r}: {tp[0]}-{tp[1]} is not owned by member {member_id!r} "
            f"(epoch {member.member_epoch}); it was revoked or never assigned",
        )
        for tp in partitions
        # `owned`, not `assignment`: a partition being revoked is still the
        # member's until it acknowledges (nobody else can have it yet), so
        # the member may commit what it processed before letting it go.
        if tp not in member.owned
    }
