"""The group consumer's membership state machine, as pure logic.

Goal: the member joins with epoch 0 and a member id of its own, new for
each join and kept when the join is retried (a lost answer then names the
same member), and leaves with it when the join's answer never came; it reports as
owned only what the application has applied, so a revoked partition leaves
`owned_partitions` only after poll() ran on_revoke, and that news goes out
at once; revocations are applied before new partitions are taken on; a
removed or fenced member (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, or no
acknowledged heartbeat for a session timeout) gives its partitions up as
lost before it joins again (a fenced dynamic member id is told to leave
first); answers to requests of an earlier incarnation are ignored; static
members leave with epoch -2; errors that cannot go away are fatal; and no
transition happens that the table does not list.

Method: `oncelog._membership.GroupMembership` driven directly with requests,
answers and times as values (no threads, no network, no clock).
"""

from __future__ import annotations

import itertools
import re

import pytest

from oncelog import TopicPartition, errors
from oncelog._membership import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    TABLE,
    GroupMembership,
    HeartbeatAnswer,
    HeartbeatRequest,
    MemberState,
    Plan,
    RequestKind,
)
from oncelog.errors import ErrorCode

A0, A1, A2 = (TopicPartition("a", p) for p in range(3))
SESSION_MS = 3_000
INTERVAL_MS = 500


def answer(member_id: str = "m-1", epoch: int = 1,
           assignment: set[TopicPartition] | None = None) -> HeartbeatAnswer:
    return HeartbeatAnswer(member_id, epoch, INTERVAL_MS,
                           None if assignment is None else frozenset(assignment))


def request(m: GroupMembership, now_ms: int) -> HeartbeatRequest:
    req = m.next_request(now_ms)
    assert req is not None, f"nothing to send at {now_ms} ({m})"
    return req


def joined(assignment: set[TopicPartition], *, instance_id: str | None = None,
           now_ms: int = 0) -> GroupMembership:
    """A member that joined, got `assignment` and applied it (stable)."""
    m = GroupMembership("g", session_timeout_ms=SESSION_MS, group_instance_id=instance_id)
    m.subscribe(("a",), now_ms)
    join = request(m, now_ms)
    m.on_response(join, answer(assignment=assignment), now_ms, now_ms)
    plan = m.plan()
    if plan is not None:
        m.applied(plan, now_ms)
    assert m.state is MemberState.STABLE
    return m


def error(code: ErrorCode) -> errors.OncelogError:
    return errors.error_for(code, f"injected {code.name}")


# ------------------------------------------------------------------ the table


def test_every_transition_pair_is_checked_against_the_table() -> None:
    for source, target in itertools.product(MemberState, MemberState):
        m = GroupMembership("g", session_timeout_ms=SESSION_MS)
        m.state = source
        if target is source or target in TABLE[source]:
            m.transition_to(target)
            assert m.state is target
        else:
            with pytest.raises(RuntimeError, match="illegal transition"):
                m.transition_to(target)
            assert m.state is source


def test_every_state_can_be_closed() -> None:
    for state in MemberState:
        m = GroupMembership("g", session_timeout_ms=SESSION_MS)
        m.state = state
        m.close()
        assert m.state is MemberState.UNSUBSCRIBED
        assert m.next_request(10**9) is None


# ------------------------------------------------------------- join, assign


def test_join_then_take_on_the_assignment() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    assert m.next_request(0) is None  # not subscribed: nothing to send
    m.subscribe(("b", "a"), 0)
    join = request(m, 0)
    assert (join.kind, join.member_epoch) == (RequestKind.JOIN, JOIN_EPOCH)
    assert re.fullmatch("[0-9a-f]{32}", join.member_id), join.member_id
    assert join.owned_partitions == () and join.session_timeout_ms == SESSION_MS
    assert join.subscribed_topics == ("b", "a")
    m.on_response(join, answer(assignment={A0, A1}), 0, 5)
    assert (m.member_id, m.member_epoch, m.state) == ("m-1", 1, MemberState.RECONCILING)
    # The coordinator's assignment is not owned until poll() applies it.
    beat = request(m, 505)
    assert beat.owned_partitions == ()
    m.on_response(beat, answer(), 505, 506)
    plan = m.plan()
    assert plan == Plan(lost=frozenset(), revoke=frozenset(), assign=frozenset({A0, A1}))
    m.applied(plan, 600)
    assert m.state is MemberState.STABLE and m.plan() is None
    # The news goes out at once, not an interval later.
    beat = request(m, 600)
    assert (beat.kind, beat.member_epoch, beat.owned_partitions) == (
        RequestKind.HEARTBEAT, 1, (A0, A1))


def test_heartbeats_follow_the_coordinators_interval() -> None:
    m = joined({A0})
    beat = request(m, 0)
    m.on_response(beat, answer(), 0, 10)
    assert m.next_request(10 + INTERVAL_MS - 1) is None
    assert m.wait_ms(10) == INTERVAL_MS
    assert request(m, 10 + INTERVAL_MS).kind is RequestKind.HEARTBEAT


def test_revocation_is_reported_only_after_it_is_applied_and_comes_before_assignment() -> None:
    m = joined({A0, A1})
    beat = request(m, 0)
    m.on_response(beat, answer(epoch=2, assignment={A1, A2}), 0, 10)
    assert m.state is MemberState.RECONCILING
    plan = m.plan()
    # A0 goes first; A2 waits until the revocation is out.
    assert plan == Plan(lost=frozenset(), revoke=frozenset({A0}), assign=frozenset())
    # Until poll() has run on_revoke, heartbeats still report A0 as owned.
    beat = request(m, 10 + INTERVAL_MS)
    assert beat.owned_partitions == (A0, A1)
    m.on_response(beat, answer(epoch=2), 510, 515)
    m.applied(plan, 520)
    beat = request(m, 520)
    assert beat.owned_partitions == (A1,)
    m.on_response(beat, answer(epoch=2), 520, 525)
    plan = m.plan()
    assert plan == Plan(lost=frozenset(), revoke=frozenset(), assign=frozenset({A2}))
    m.applied(plan, 530)
    assert m.state is MemberState.STABLE
    assert request(m, 530).owned_partitions == (A1, A2)


def test_one_request_at_a_time() -> None:
    m = joined({A0})
    beat = request(m, 0)
    m.subscribe(("a", "b"), 1)
    assert m.next_request(10**6) is None and m.wait_ms(1) is None
    m.on_error(beat, error(ErrorCode.NETWORK_EXCEPTION), 2, retry_after_ms=0)
    assert request(m, 2).subscribed_topics == ("a", "b")


def test_an_answer_to_a_heartbeat_sent_before_a_plan_was_applied_keeps_the_news_urgent() -> None:
    m = joined({A0, A1})
    m.on_response(request(m, 0), answer(epoch=2, assignment={A1}), 0, 10)
    in_flight = request(m, 10 + INTERVAL_MS)  # still reports A0
    plan = m.plan()
    assert plan is not None
    m.applied(plan, 600)
    m.on_response(in_flight, answer(epoch=2), 510, 700)
    # Without this, the revocation would wait a whole interval.
    assert request(m, 700).owned_partitions == (A1,)


def test_an_unchanged_assignment_is_left_out_of_answers() -> None:
    m = joined({A0})
    m.on_response(request(m, 0), answer(assignment=None), 0, 10)
    assert m.state is MemberState.STABLE and m.owned == {A0} and m.plan() is None


def test_a_new_subscription_is_sent_at_once() -> None:
    m = joined({A0})
    m.on_response(request(m, 0), answer(), 0, 10)
    assert m.next_request(20) is None
    m.subscribe(("a", "b"), 20)
    assert request(m, 20).subscribed_topics == ("a", "b")


def test_a_subscription_changed_while_a_heartbeat_was_out_is_sent_at_once() -> None:
    m = joined({A0})
    beat = request(m, 0)
    m.subscribe(("a", "b"), 1)
    m.on_response(beat, answer(), 0, 10)
    assert request(m, 10).subscribed_topics == ("a", "b")


# ------------------------------------------------------------- losing them


@pytest.mark.parametrize("code", [ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH])
def test_a_removed_or_fenced_member_loses_its_partitions_then_rejoins(code: ErrorCode) -> None:
    m = joined({A0, A1})
    m.on_error(request(m, 0), error(code), 10, retry_after_ms=100)
    assert m.state is MemberState.FENCED
    assert m.error is not None and m.error.code is code
    assert m.next_request(10) is None  # nothing is sent until poll() dropped them
    plan = m.plan()
    assert plan == Plan(lost=frozenset({A0, A1}), revoke=frozenset(), assign=frozenset(),
                        ends_fence=True)
    m.applied(plan, 20)
    assert m.state is MemberState.JOINING and m.owned == frozenset()
    first = request(m, 20)
    if code is ErrorCode.FENCED_MEMBER_EPOCH:
        # The coordinator still holds the old member id: it is told to leave
        # first, so its partitions are released at once.
        assert (first.kind, first.member_id, first.member_epoch) == (
            RequestKind.LEAVE, "m-1", LEAVE_EPOCH)
        m.on_error(first, error(ErrorCode.UNKNOWN_MEMBER_ID), 25, retry_after_ms=100)
        first = request(m, 25)
    assert (first.kind, first.member_epoch) == (RequestKind.JOIN, 0)
    assert first.member_id not in ("", "m-1")
    m.on_response(first, answer(member_id=first.member_id, epoch=5, assignment={A1}), 30, 30)
    assert (m.member_id, m.member_epoch, m.state) == (first.member_id, 5,
                                                      MemberState.RECONCILING)


def test_a_fenced_static_member_rejoins_with_its_instance_id_without_a_leave() -> None:
    m = joined({A0}, instance_id="node-7")
    m.on_error(request(m, 0), error(ErrorCode.FENCED_MEMBER_EPOCH), 10, retry_after_ms=100)
    plan = m.plan()
    assert plan is not None
    m.applied(plan, 20)
    join = request(m, 20)
    assert (join.kind, join.group_instance_id) == (RequestKind.JOIN, "node-7")


def test_no_acknowledged_heartbeat_for_a_session_means_the_partitions_are_lost() -> None:
    m = joined({A0}, now_ms=1_000)
    beat = request(m, 1_400)
    m.on_response(beat, answer(), 1_400, 1_450)
    # Retriable failures after that: the coordinator may remove us at
    # 1_400 + session at the earliest (it heard from us no earlier).
    for now in (1_950, 2_500, 3_100):
        m.on_error(request(m, now), error(ErrorCode.COORDINATOR_NOT_AVAILABLE), now,
                   retry_after_ms=1)
        m.check_session(now)
        assert m.state is MemberState.STABLE
    wait_ms = m.wait_ms(3_100)
    assert wait_ms is not None and wait_ms <= 1_400 + SESSION_MS + 1 - 3_100
    m.check_session(1_400 + SESSION_MS)
    assert m.state is MemberState.STABLE
    m.check_session(1_400 + SESSION_MS + 1)
    assert m.state is MemberState.FENCED
    assert m.error is not None and "session_timeout_ms=3000" in m.error.message
    plan = m.plan()
    assert plan is not None and plan.lost == {A0}


def test_answers_to_requests_of_an_earlier_incarnation_are_ignored() -> None:
    m = joined({A0})
    old = request(m, 0)
    m.on_response(old, answer(), 0, 5)
    m.on_error(request(m, 10 + INTERVAL_MS), error(ErrorCode.UNKNOWN_MEMBER_ID), 515,
               retry_after_ms=1)
    # A duplicate or late answer to the older heartbeat changes nothing.
    m.on_response(old, answer(epoch=9, assignment={A0, A1}), 0, 520)
    assert m.state is MemberState.FENCED and m.member_epoch == -1
    plan = m.plan()
    assert plan is not None
    m.applied(plan, 530)
    m.on_error(old, error(ErrorCode.FENCED_MEMBER_EPOCH), 540, retry_after_ms=1)
    assert m.state is MemberState.JOINING


def test_retriable_errors_are_retried_after_the_backoff() -> None:
    m = joined({A0})
    now = 0
    for code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                 ErrorCode.NETWORK_EXCEPTION):
        m.on_error(request(m, now), error(code), now, retry_after_ms=250)
        assert m.state is MemberState.STABLE and m.owned == {A0}
        assert m.next_request(now + 249) is None
        m.on_response(request(m, now + 250), answer(), now + 250, now + 250)
        now += 250 + INTERVAL_MS


@pytest.mark.parametrize("code", [ErrorCode.FENCED_INSTANCE_ID, ErrorCode.INVALID_GROUP_ID,
                                  ErrorCode.INVALID_REQUEST])
def test_errors_that_cannot_go_away_are_fatal(code: ErrorCode) -> None:
    m = joined({A0})
    m.on_error(request(m, 0), error(code), 0, retry_after_ms=1)
    assert m.state is MemberState.FATAL and m.error is not None and m.error.code is code
    assert m.next_request(10**6) is None
    plan = m.plan()
    assert plan is not None and plan.lost == {A0}
    m.applied(plan, 1)
    assert m.state is MemberState.FATAL and m.plan() is None


def test_a_cluster_without_a_group_coordinator_is_fatal_though_the_code_is_retriable() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    m.subscribe(("a",), 0)
    m.on_error(request(m, 0), error(ErrorCode.COORDINATOR_NOT_AVAILABLE), 0,
               retry_after_ms=1, fatal=True)
    assert m.state is MemberState.FATAL


# ------------------------------------------------------------------ leaving


@pytest.mark.parametrize(("instance_id", "epoch"), [(None, LEAVE_EPOCH),
                                                    ("node-1", STATIC_LEAVE_EPOCH)])
def test_leave(instance_id: str | None, epoch: int) -> None:
    m = joined({A0}, instance_id=instance_id)
    m.leave(0)
    assert m.state is MemberState.LEAVING
    leave = request(m, 0)
    assert (leave.kind, leave.member_id, leave.member_epoch) == (RequestKind.LEAVE, "m-1", epoch)
    m.on_error(leave, error(ErrorCode.NOT_COORDINATOR), 0, retry_after_ms=100)
    assert m.state is MemberState.LEAVING
    m.on_response(request(m, 100), answer(epoch=epoch), 100, 110)
    assert m.state is MemberState.UNSUBSCRIBED and m.member_id == ""


def test_a_leave_that_fails_for_good_still_leaves() -> None:
    m = joined({A0})
    m.leave(0)
    m.on_error(request(m, 0), error(ErrorCode.UNKNOWN_MEMBER_ID), 0, retry_after_ms=1)
    assert m.state is MemberState.UNSUBSCRIBED


def test_leaving_before_the_join_was_sent_sends_nothing() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    m.subscribe(("a",), 0)
    m.leave(0)
    assert m.state is MemberState.UNSUBSCRIBED and m.next_request(0) is None


def test_leaving_while_the_join_is_out_leaves_with_the_id_it_brings() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    m.subscribe(("a",), 0)
    join = request(m, 0)
    m.leave(1)
    assert m.state is MemberState.LEAVING and m.next_request(1) is None
    m.on_response(join, answer(member_id="m-9", assignment={A0}), 0, 2)
    leave = request(m, 2)
    assert (leave.kind, leave.member_id, leave.member_epoch) == (
        RequestKind.LEAVE, "m-9", LEAVE_EPOCH)
    assert m.owned == frozenset()  # the assignment was never taken on
    m.on_response(leave, answer(member_id="m-9", epoch=LEAVE_EPOCH), 2, 3)
    assert m.state is MemberState.UNSUBSCRIBED


# ------------------------------------------------ lost answers to a join


def test_a_join_whose_answer_was_lost_is_retried_with_the_same_member_id() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    m.subscribe(("a",), 0)
    join = request(m, 0)
    m.on_error(join, error(ErrorCode.NETWORK_EXCEPTION), 5, retry_after_ms=100)
    again = request(m, 105)
    assert (again.kind, again.member_id) == (RequestKind.JOIN, join.member_id)
    m.on_response(again, answer(member_id=join.member_id, assignment={A0}), 105, 110)
    assert (m.member_id, m.state) == (join.member_id, MemberState.RECONCILING)


def test_each_join_has_a_new_member_id() -> None:
    ids = set()
    for _ in range(3):
        m = GroupMembership("g", session_timeout_ms=SESSION_MS)
        m.subscribe(("a",), 0)
        ids.add(request(m, 0).member_id)
    assert len(ids) == 3


def test_leaving_after_a_join_whose_answer_was_lost_leaves_with_its_id() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    m.subscribe(("a",), 0)
    join = request(m, 0)
    m.on_error(join, error(ErrorCode.NETWORK_EXCEPTION), 5, retry_after_ms=100)
    m.leave(10)
    assert m.state is MemberState.LEAVING
    leave = request(m, 10)
    assert (leave.kind, leave.member_id, leave.member_epoch) == (
        RequestKind.LEAVE, join.member_id, LEAVE_EPOCH)
    # The join never landed: the coordinator does not know the id.
    m.on_error(leave, error(ErrorCode.UNKNOWN_MEMBER_ID), 15, retry_after_ms=100)
    assert m.state is MemberState.UNSUBSCRIBED


def test_leaving_while_a_join_is_out_whose_answer_is_lost_leaves_with_its_id() -> None:
    m = GroupMembership("g", session_timeout_ms=SESSION_MS)
    m.subscribe(("a",), 0)
    join = request(m, 0)
    m.leave(1)
    m.on_error(join, error(ErrorCode.NETWORK_EXCEPTION), 5, retry_after_ms=100)
    leave = request(m, 5)
    assert (leave.kind, leave.member_id) == (RequestKind.LEAVE, join.member_id)
    m.on_response(leave, answer(member_id=join.member_id, epoch=LEAVE_EPOCH), 5, 6)
    assert m.state is MemberState.UNSUBSCRIBED and m.member_id == ""
