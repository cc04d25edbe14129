"""A group consumer's membership, as one state machine (pure logic).

The group coordinator assigns partitions itself (docs/groups.md, after
Kafka's KIP-848), so all a member does is send `ConsumerGroupHeartbeat` and
apply the assignment it gets back. Two threads share this object, under the
consumer's lock:

* the heartbeat thread asks `next_request(now_ms)` what to send, sends it,
  and hands the outcome to `on_response` / `on_error`;
* the application's thread, inside `poll()`, asks `plan()` what to apply
  (partitions lost, revoked, assigned), runs the callbacks and tells
  `applied(plan)` when it is done. Only then do revoked partitions leave
  `owned`, the set the next heartbeat reports: the coordinator gives a
  partition to its next owner only after that, so two members never own one
  partition at the same time.

No gRPC, threads or clock here: times come in as `now_ms`, requests go out
as values. `TABLE` lists every state's allowed next states; `transition_to`
checks it, and a test walks every pair.

A join carries a member id the member chose itself (a random UUID per join,
as Kafka's KIP-1082 has it): when a join's answer is lost, the retried join
names the same member, so the coordinator does not make a second one that
would hold half the partitions until its session timed out; and a member
that leaves after such a join can name the member to remove.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from oncelog.types import TopicPartition
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError

# member_epoch values of ConsumerGroupHeartbeat with a special meaning.
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
# Until the coordinator names one: how often to heartbeat.
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000

# The member was removed or its epoch is not the coordinator's: it must give
# up its partitions without committing and join again (epoch 0).
REJOIN_CODES = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH})


class MemberState(enum.Enum):
    """Where the member is in the group protocol. Each state's doc says what
    the heartbeat thread sends (action) and where it can go (transition)."""

    UNSUBSCRIBED = "unsubscribed"
    """Not in the group: no subscription yet, or left.
    action: nothing is sent.
    transition: joining (subscribe)."""

    JOINING = "joining"
    """Joining with member_epoch 0 (first time, or after losing the
    partitions); a member id left behind by a fence is first told to leave.
    action: the join request, at once and again after each retriable error.
    transition: reconciling or stable on the answer; fatal; leaving;
    unsubscribed (closing before the answer)."""

    RECONCILING = "reconciling"
    """The coordinator's assignment differs from what the application owns:
    poll() must revoke and assign.
    action: heartbeats at the interval, and one at once after each applied
    plan.
    transition: stable once owned equals the assignment; fenced; fatal;
    leaving."""

    STABLE = "stable"
    """The application owns exactly the coordinator's assignment.
    action: heartbeats at the interval.
    transition: reconciling on a new assignment; fenced; fatal; leaving."""

    FENCED = "fenced"
    """The coordinator removed the member (UNKNOWN_MEMBER_ID), fenced its
    epoch (FENCED_MEMBER_EPOCH), or no heartbeat was acknowledged for a
    session timeout: the partitions may belong to another member already.
    action: nothing is sent until poll() has dropped them (on_lost, no
    commit).
    transition: joining once the loss is applied; leaving; unsubscribed."""

    LEAVING = "leaving"
    """close() or unsubscribe(): the leave heartbeat (member_epoch -1, or -2
    for a static member) is being sent.
    action: the leave request; retried on retriable errors.
    transition: unsubscribed."""

    FATAL = "fatal"
    """An error the member cannot recover from (FENCED_INSTANCE_ID: another
    process took its group_instance_id; INVALID_GROUP_ID; INVALID_REQUEST):
    poll() raises it.
    action: nothing is sent.
    transition: unsubscribed (close)."""


S = MemberState
TABLE: dict[MemberState, frozenset[MemberState]] = {
    S.UNSUBSCRIBED: frozenset({S.JOINING}),
    S.JOINING: frozenset({S.RECONCILING, S.STABLE, S.FATAL, S.LEAVING, S.UNSUBSCRIBED}),
    S.RECONCILING: frozenset({S.STABLE, S.FENCED, S.FATAL, S.LEAVING}),
    S.STABLE: frozenset({S.RECONCILING, S.FENCED, S.FATAL, S.LEAVING}),
    S.FENCED: frozenset({S.JOINING, S.LEAVING, S.UNSUBSCRIBED}),
    S.LEAVING: frozenset({S.UNSUBSCRIBED}),
    S.FATAL: frozenset({S.UNSUBSCRIBED}),
}
del S


class RequestKind(enum.Enum):
    JOIN = "join"
    HEARTBEAT = "heartbeat"
    # Leaving for good (close/unsubscribe), or giving up a fenced member id.
    LEAVE = "leave"


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """What to send, as a value; the heartbeat thread turns it into a proto."""

    kind: RequestKind
    member_id: str
    member_epoch: int
    group_instance_id: str | None
    session_timeout_ms: int
    subscribed_topics: tuple[str, ...]
    owned_partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """A successful ConsumerGroupHeartbeat answer; `assignment` is None when
    the coordinator left it out (unchanged)."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[TopicPartition] | None


@dataclass(frozen=True, slots=True)
class Plan:
    """What poll() must apply, in this order: drop `lost` (no commit), revoke
    `revoke` (commit allowed), then start reading `assign`."""

    lost: frozenset[TopicPartition]
    revoke: frozenset[TopicPartition]
    assign: frozenset[TopicPartition]
    # True when the plan ends a fence: applying it lets the member rejoin.
    ends_fence: bool = False


class GroupMembership:
    """The member's state, ids and partitions. Not thread-safe: the consumer
    calls it under its lock."""

    def __init__(
        self,
        group_id: str,
        *,
        session_timeout_ms: int,
        group_instance_id: str | None = None,
        new_member_id: Callable[[], str] | None = None,
    ) -> None:
        self.group_id = group_id
        # Each join's member id (a random UUID; a simulation passes its
        # seed's, so that a run replays).
        self._new_member_id = new_member_id or _random_member_id
        self.session_timeout_ms = session_timeout_ms
        self.group_instance_id = group_instance_id
        self.state = MemberState.UNSUBSCRIBED
        self.member_id = ""
        self.member_epoch = -1
        self.heartbeat_interval_ms = DEFAULT_HEARTBEAT_INTERVAL_MS
        self.subscription: tuple[str, ...] = ()
        # What the application has taken over (after on_assign) and not yet
        # given up (after on_revoke / on_lost): what heartbeats report.
        self.owned: frozenset[TopicPartition] = frozenset()
        # The coordinator's latest assignment; None until it sends one.
        self.target: frozenset[TopicPartition] | None = None
        # The error behind FATAL, or the reason for FENCED (for logs).
        self.error: OncelogError | None = None
        # A member id that was fenced while the coordinator may still hold it:
        # told to leave before joining again, so its partitions are released
        # at once instead of at its session timeout.
        self.stale_member_id = ""
        # The id this member's joins carry (see the module's doc); a join
        # with it has been sent since the last join began.
        self._join_member_id = ""
        self._join_sent = False
        self._due_ms = 0
        # The request sent and not yet answered (one at a time).
        self._in_flight: HeartbeatRequest | None = None
        # When the last acknowledged heartbeat was sent: the coordinator heard
        # from us no earlier than that, so our session lasts until
        # then + session_timeout_ms at the least.
        self._acked_sent_ms: int | None = None

    def __repr__(self) -> str:
        return (f"GroupMembership({self.group_id!r}, {self.state.value}, "
                f"member {self.member_id!r} epoch {self.member_epoch})")

    def transition_to(self, target: MemberState) -> None:
        """Moves to `target` if the table allows it; a refused move is a bug
        and raises."""
        if target is self.state:
            return
        if target not in TABLE[self.state]:
            raise RuntimeError(
                f"group {self.group_id!r} member {self.member_id!r}: illegal transition "
                f"{self.state.value} -> {target.value}"
            )
        self.state = target

    # ----------------------------------------------------- application side

    def subscribe(self, topics: tuple[str, ...], now_ms: int) -> None:
        """A new subscription: join, or tell the coordinator at once."""
        self.subscription = topics
        if self.state is MemberState.UNSUBSCRIBED:
            self._start_join(now_ms)
        else:
            self._due_ms = now_ms

    def leave(self, now_ms: int) -> None:
        """close()/unsubscribe(): send the leave heartbeat (the application
        has already dropped its partitions)."""
        if self.state in (MemberState.UNSUBSCRIBED, MemberState.LEAVING):
            return
        join_in_flight = self._in_flight is not None and self._in_flight.kind is RequestKind.JOIN
        if (self.state is MemberState.JOINING and not self.member_id and self._join_sent
                and not join_in_flight):
            # A join went out and its answer was lost: the member may exist.
            self.member_id = self._join_member_id
        if self.state is MemberState.FATAL or (
            not self.member_id and not self.stale_member_id and not join_in_flight
        ):
            self._reset_identity()
            self.transition_to(MemberState.UNSUBSCRIBED)
            return
        # With a join in flight, its answer names the member id to leave with.
        self.transition_to(MemberState.LEAVING)
        self._due_ms = now_ms

    def plan(self) -> Plan | None:
        """What poll() must apply now, or None."""
        if self.state is MemberState.FENCED:
            return Plan(lost=self.owned, revoke=frozenset(), assign=frozenset(), ends_fence=True)
        if self.state is MemberState.FATAL and self.owned:
            return Plan(lost=self.owned, revoke=frozenset(), assign=frozenset())
        if self.state is not MemberState.RECONCILING or self.target is None:
            return None
        revoke = self.owned - self.target
        assign = self.target - self.owned
        if not revoke and not assign:
            return None
        # Revocations are acknowledged before anything new is taken on (a
        # heartbeat goes out between them), as the coordinator waits for them.
        return Plan(lost=frozenset(), revoke=revoke, assign=frozenset() if revoke else assign)

    def applied(self, plan: Plan, now_ms: int) -> None:
        """poll() has applied `plan`; the next heartbeat reports it at once."""
        self.owned = (self.owned - plan.lost - plan.revoke) | plan.assign
        self._due_ms = now_ms
        if plan.ends_fence and self.state is MemberState.FENCED:
            if self.subscription:
                self._start_join(now_ms)
            else:
                self._reset_identity()
                self.transition_to(MemberState.UNSUBSCRIBED)
            return
        self._settle()

    def check_session(self, now_ms: int) -> None:
        """Fences the member when no heartbeat has been acknowledged for a
        session timeout: the coordinator has probably removed it and given its
        partitions to others, so it must stop reading them now."""
        if self.state not in (MemberState.RECONCILING, MemberState.STABLE):
            return
        if self._acked_sent_ms is None:
            return
        silent_ms = now_ms - self._acked_sent_ms
        if silent_ms > self.session_timeout_ms:
            self._fence(errors.error_for(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"no heartbeat of member {self.member_id!r} of group {self.group_id!r} was "
                f"acknowledged for {silent_ms} ms, longer than session_timeout_ms="
                f"{self.session_timeout_ms}",
            ), now_ms, stale=True)

    # ------------------------------------------------------ heartbeat side

    def next_request(self, now_ms: int) -> HeartbeatRequest | None:
        """The request to send now, or None (nothing due: see `wait_ms`)."""
        state = self.state
        if state in (MemberState.UNSUBSCRIBED, MemberState.FENCED, MemberState.FATAL):
            return None
        if now_ms < self._due_ms or self._in_flight is not None:
            return None
        if state is MemberState.LEAVING:
            member_id = self.member_id or self.stale_member_id
            epoch = STATIC_LEAVE_EPOCH if self.group_instance_id else LEAVE_EPOCH
            req = self._request(RequestKind.LEAVE, member_id, epoch, ())
        elif state is MemberState.JOINING:
            if self.stale_member_id:
                req = self._request(RequestKind.LEAVE, self.stale_member_id, LEAVE_EPOCH, ())
            else:
                req = self._request(RequestKind.JOIN, self._join_member_id, JOIN_EPOCH, ())
                self._join_sent = True
        else:
            req = self._request(RequestKind.HEARTBEAT, self.member_id, self.member_epoch,
                                tuple(sorted(self.owned)))
        self._in_flight = req
        return req

    def wait_ms(self, now_ms: int) -> int | None:
        """How long the heartbeat thread may sleep (None: until woken)."""
        if self.state in (MemberState.UNSUBSCRIBED, MemberState.FENCED, MemberState.FATAL):
            return None
        if self._in_flight is not None:
            return None
        wait = max(0, self._due_ms - now_ms)
        if self._acked_sent_ms is not None and self.state in (
            MemberState.RECONCILING, MemberState.STABLE
        ):
            # Wake up for check_session too.
            wait = min(wait, max(0, self._acked_sent_ms + self.session_timeout_ms + 1 - now_ms))
        return wait

    def on_response(self, request: HeartbeatRequest, answer: HeartbeatAnswer, sent_ms: int,
                    now_ms: int) -> None:
        """A successful answer to `request` (sent at `sent_ms`)."""
        self._answered(request)
        if request.kind is RequestKind.LEAVE:
            self._left(request)
            return
        if request.kind is RequestKind.JOIN and self.state is MemberState.LEAVING:
            # close() came while the join was out: leave with the new id.
            self.member_id = answer.member_id
            self._due_ms = now_ms
            if not self.member_id:
                self._left(None)
            return
        if not self._current(request):
            return  # answered after a fence, a leave or a rejoin: stale
        self.member_id = answer.member_id or self.member_id
        self.member_epoch = answer.member_epoch
        if answer.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = answer.heartbeat_interval_ms
        if answer.assignment is not None:
            self.target = answer.assignment
        elif request.kind is RequestKind.JOIN:
            self.target = frozenset()
        self._acked_sent_ms = sent_ms
        if (request.owned_partitions != tuple(sorted(self.owned))
                or request.subscribed_topics != self.subscription):
            # poll() applied a plan (or the subscription changed) while this
            # heartbeat was out: report the news at once, not an interval later.
            self._due_ms = now_ms
        else:
            self._due_ms = now_ms + self.heartbeat_interval_ms
        self.error = None
        self._settle()

    def on_error(self, request: HeartbeatRequest, exc: OncelogError, now_ms: int,
                 *, retry_after_ms: int, fatal: bool = False) -> None:
        """A failed heartbeat. Retriable errors (the coordinator moved, is
        loading, is unreachable) are retried after `retry_after_ms`; the caller
        finds the coordinator again. `fatal`: the error cannot go away (the
        cluster has no group coordinator), whatever its code says."""
        self._answered(request)
        if request.kind is RequestKind.JOIN and self.state is MemberState.LEAVING:
            # The join may have created the member before its answer was
            # lost: leave with the id it carried (a member that does not
            # exist answers UNKNOWN_MEMBER_ID, which also counts as left).
            self.member_id = request.member_id
            self._due_ms = now_ms
            if not self.member_id:
                self._left(None)
            return
        if request.kind is RequestKind.LEAVE:
            if exc.retriable and not fatal and self.state in (MemberState.LEAVING,
                                                              MemberState.JOINING):
                self._due_ms = now_ms + retry_after_ms
            else:
                self._left(request)  # gone already, or nothing more we can do
            return
        if not self._current(request):
            return
        if exc.retriable and not fatal:
            self._due_ms = now_ms + retry_after_ms
            return
        if exc.code in REJOIN_CODES:
            if self.state is MemberState.JOINING:
                # A join cannot be fenced; treat it like a bad answer and retry.
                self._due_ms = now_ms + retry_after_ms
                return
            self._fence(exc, now_ms, stale=exc.code is ErrorCode.FENCED_MEMBER_EPOCH)
            return
        self.error = exc
        self.transition_to(MemberState.FATAL)

    def fail(self, exc: OncelogError) -> None:
        """Nothing more can be sent (the heartbeat thread died): poll() raises
        `exc` from now on, after dropping the partitions."""
        self.error = exc
        if MemberState.FATAL in TABLE[self.state]:
            self.transition_to(MemberState.FATAL)

    def close(self) -> None:
        """The consumer is closed: whatever the state, nothing more is sent."""
        if self.state in (MemberState.RECONCILING, MemberState.STABLE):
            self.transition_to(MemberState.LEAVING)
        self._reset_identity()
        self.transition_to(MemberState.UNSUBSCRIBED)

    # ------------------------------------------------------------ helpers

    def _request(self, kind: RequestKind, member_id: str, epoch: int,
                 owned: tuple[TopicPartition, ...]) -> HeartbeatRequest:
        return HeartbeatRequest(
            kind=kind, member_id=member_id, member_epoch=epoch,
            group_instance_id=self.group_instance_id,
            session_timeout_ms=self.session_timeout_ms,
            subscribed_topics=self.subscription, owned_partitions=owned,
        )

    def _answered(self, request: HeartbeatRequest) -> None:
        if self._in_flight is request:
            self._in_flight = None

    def _current(self, request: HeartbeatRequest) -> bool:
        """Whether the answer to `request` still concerns this member."""
        if request.kind is RequestKind.JOIN:
            return self.state is MemberState.JOINING and not self.stale_member_id
        return (self.state in (MemberState.RECONCILING, MemberState.STABLE)
                and request.member_id == self.member_id)

    def _start_join(self, now_ms: int) -> None:
        self.member_id = ""
        self._join_member_id = self._new_member_id()
        self._join_sent = False
        self.member_epoch = JOIN_EPOCH
        self.target = None
        self._acked_sent_ms = None
        self._due_ms = now_ms
        self.transition_to(MemberState.JOINING)

    def _settle(self) -> None:
        if self.state not in (MemberState.RECONCILING, MemberState.STABLE, MemberState.JOINING):
            return
        target = self.target if self.target is not None else self.owned
        self.transition_to(
            MemberState.STABLE if target == self.owned else MemberState.RECONCILING
        )

    def _fence(self, reason: OncelogError, now_ms: int, *, stale: bool) -> None:
        # A static member needs no leave: joining with its instance id
        # replaces the old member at the coordinator.
        self.stale_member_id = self.member_id if stale and not self.group_instance_id else ""
        self.error = reason
        self.member_id = ""
        self.member_epoch = -1
        self.target = None
        self._acked_sent_ms = None
        self._due_ms = now_ms
        self.transition_to(MemberState.FENCED)

    def _left(self, request: HeartbeatRequest | None) -> None:
        if request is not None and request.member_id == self.stale_member_id:
            self.stale_member_id = ""
            if self.state is MemberState.JOINING:
                return  # the old id is gone: now the join itself
        if self.state is MemberState.LEAVING:
            self._reset_identity()
            self.transition_to(MemberState.UNSUBSCRIBED)

    def _reset_identity(self) -> None:
        self.member_id = ""
        self.stale_member_id = ""
        self.member_epoch = -1
        self.target = None
        self._acked_sent_ms = None


def _random_member_id() -> str:
    return uuid.uuid4().hex
