"""Kafka's classic group protocol in the group coordinator's pure core.

Goal: the rules of core/classic.py, which follow Kafka's classic group
coordinator, hold: the state table (every (from, to) pair); a new group's
initial rebalance delay and its extension; a rebalance that waits for every
known member up to the rebalance timeout and then drops the dynamic members
that did not rejoin (static ones stay); session expiry; protocol selection
by the members' votes among the protocols all of them support; the error
answers (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
INCONSISTENT_GROUP_PROTOCOL, MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID,
INVALID_SESSION_TIMEOUT); static membership (a restarted static member
takes its old place without a rebalance, the old member id is fenced);
which commits a classic group accepts; one type per group id; the record
(Kafka's GroupMetadata) and what replaying it gives; and that a planner
never changes the group it is given.

Method: the planners called directly with an injected clock (`now_ms`);
`Run` keeps the current group and, like the runtime, which parked call got
which answer, so a test reads as the sequence of requests and ticks it is.
Seeded random runs (the seed is in the test id) check after every step the
state invariants and that the parked calls the core counts are exactly the
ones the runtime would hold, so none hangs and none is answered twice.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.kernel.invariants import InvariantViolation
from services.group_coordinator.core import classic as cl
from services.group_coordinator.core import consumer_protocol
from services.group_coordinator.core import groups as gr
from services.group_coordinator.core.classic import ClassicGroupState as S

GROUP = "g"
DELAY_MS = 100
SESSION_MS = 10_000
REBALANCE_MS = 30_000
CONFIG = cl.ClassicConfig(initial_rebalance_delay_ms=DELAY_MS,
                          new_member_join_timeout_ms=60_000,
                          min_session_timeout_ms=1000, max_session_timeout_ms=60_000)
RANGE = cl.Protocol("range", b"range-meta")
ROUND_ROBIN = cl.Protocol("roundrobin", b"rr-meta")
_suffixes = itertools.count()


def code(error: ServiceError | None) -> ErrorCode:
    return ErrorCode.NONE if error is None else error.code


@dataclass
class Run:
    """One group driven through the planners, as the runtime drives it: a
    step's group replaces the current one, and answers to parked calls are
    kept per member."""

    group: cl.AnyGroup | None = None
    now_ms: int = 0
    joins: dict[str, cl.JoinReply] = field(default_factory=dict)
    syncs: dict[str, cl.SyncReply] = field(default_factory=dict)
    persisted: list[dict[str, Any]] = field(default_factory=list)
    # The member id the last JoinGroup's call is about when it parked it or
    # completed it in the same step (the runtime keys its futures by it).
    last_call_member_id: str = ""

    def apply(self, outcome: cl.Outcome[Any]) -> Any:
        if outcome.group is not None:
            if outcome.persist:
                self.persisted.append(cl.snapshot(outcome.group))
            self.group = outcome.group
        else:
            assert not outcome.persist
        self.joins.update(outcome.join_replies)
        self.syncs.update(outcome.sync_replies)
        return outcome.reply

    @property
    def classic(self) -> cl.ClassicGroup:
        assert isinstance(self.group, cl.ClassicGroup)
        return self.group

    def join(self, member_id: str = "", *, instance_id: str = "",
             protocols: Sequence[cl.Protocol] = (RANGE,), protocol_type: str = "consumer",
             session_ms: int = SESSION_MS, rebalance_ms: int = REBALANCE_MS,
             require_known: bool = False, client_id: str = "client",
             ) -> tuple[str, cl.JoinReply | None]:
        """(the member id the call is about, its answer or None: parked)."""
        outcome = cl.plan_join(
            self.group, group_id=GROUP, member_id=member_id, instance_id=instance_id,
            protocol_type=protocol_type, protocols=protocols, session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms, client_id=client_id, client_host="/10.0.0.1",
            require_known_member_id=require_known, new_member_suffix=f"s{next(_suffixes)}",
            now_ms=self.now_ms, config=CONFIG,
        )
        reply = self.apply(outcome)
        self.last_call_member_id = outcome.member_id
        return (outcome.member_id or (reply.member_id if reply else member_id)), reply

    def sync(self, member_id: str, generation_id: int, *, instance_id: str = "",
             assignments: Sequence[tuple[str, bytes]] = (), protocol_name: str = "",
             ) -> cl.SyncReply | None:
        return self.apply(cl.plan_sync(
            self.group, group_id=GROUP, member_id=member_id, instance_id=instance_id,
            generation_id=generation_id, protocol_type="", protocol_name=protocol_name,
            assignments=assignments, now_ms=self.now_ms, config=CONFIG))

    def heartbeat(self, member_id: str, generation_id: int, *,
                  instance_id: str = "") -> ErrorCode:
        reply = self.apply(cl.plan_heartbeat(
            self.group, group_id=GROUP, member_id=member_id, instance_id=instance_id,
            generation_id=generation_id, now_ms=self.now_ms, config=CONFIG))
        return code(reply.error)

    def leave(self, *members: cl.LeavingMember) -> list[ErrorCode]:
        results = self.apply(cl.plan_leave(self.group, group_id=GROUP, members=members,
                                           now_ms=self.now_ms, config=CONFIG))
        return [code(r.error) for r in results]

    def tick(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.apply(cl.plan_tick(self.classic, now_ms=now_ms, config=CONFIG))


def keep_alive(run: Run, beating: Sequence[tuple[str, str]], generation: int,
               until_ms: int, step_ms: int = SESSION_MS // 4) -> None:
    """Ticks up to until_ms, each (member id, instance id) heartbeating
    before every tick (they stay alive without rejoining)."""
    t = run.now_ms
    while t < until_ms:
        t = min(t + step_ms, until_ms)
        run.now_ms = t
        for member_id, instance_id in beating:
            if member_id in run.classic.members:
                run.heartbeat(member_id, generation, instance_id=instance_id)
        run.tick(t)


def stable_pair(run: Run) -> tuple[str, str, int]:
    """Two dynamic members A (leader) and B through the initial rebalance and
    the leader's SyncGroup; returns their ids and the generation."""
    a, reply_a = run.join(client_id="a")
    b, reply_b = run.join(client_id="b")
    assert reply_a is None and reply_b is None
    run.tick(DELAY_MS)  # B arrived during the delay: extended once
    run.tick(2 * DELAY_MS)
    generation = run.joins[a].generation_id
    assert run.sync(a, generation, assignments=[(a, b"to-a"), (b, b"to-b")]) is not None
    assert run.classic.state is S.STABLE
    assert run.sync(b, generation) == cl.SyncReply(protocol_type="consumer",
                                                   protocol_name="range", assignment=b"to-b")
    return a, b, generation


# ------------------------------------------------------------ the state table


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_every_transition_pair_follows_the_table(current: S, target: S) -> None:
    if current in cl.VALID_PREVIOUS[target]:
        cl.check_transition(current, target, GROUP)
    else:
        with pytest.raises(InvariantViolation):
            cl.check_transition(current, target, GROUP)


def test_the_table_is_kafkas() -> None:
    assert {target: sorted(s.value for s in previous)
            for target, previous in cl.VALID_PREVIOUS.items()} == {
        S.EMPTY: ["PreparingRebalance"],
        S.PREPARING_REBALANCE: ["CompletingRebalance", "Empty", "Stable"],
        S.COMPLETING_REBALANCE: ["PreparingRebalance"],
        S.STABLE: ["CompletingRebalance"],
        S.DEAD: ["CompletingRebalance", "Dead", "Empty", "PreparingRebalance", "Stable"],
    }


# --------------------------------------------------------- join and sync


def test_two_members_join_the_leader_assigns_and_both_get_theirs() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    assert generation == 1
    leader_reply, follower_reply = run.joins[a], run.joins[b]
    assert (leader_reply.leader, follower_reply.leader) == (a, a)
    assert [(m.member_id, m.metadata) for m in leader_reply.members] == [
        (a, b"range-meta"), (b, b"range-meta")]
    assert follower_reply.members == ()
    assert leader_reply.protocol_name == follower_reply.protocol_name == "range"
    # The leader's SyncGroup wrote the group's record, with the assignments.
    [record] = run.persisted
    assert record["generation"] == 1 and record["leader"] == a
    assert {m["member_id"]: cl._unb64(m["assignment"]) for m in record["members"]} == {
        a: b"to-a", b: b"to-b"}


def test_a_follower_sync_before_the_leaders_is_parked_then_answered() -> None:
    run = Run()
    a, _ = run.join(client_id="a")
    b, _ = run.join(client_id="b")
    run.tick(DELAY_MS)
    run.tick(2 * DELAY_MS)
    generation = run.joins[a].generation_id
    assert run.sync(b, generation) is None, "parked until the leader's assignment"
    assert run.classic.members[b].awaiting_sync
    leader = run.sync(a, generation, assignments=[(a, b"A"), (b, b"B")])
    assert leader is not None and leader.assignment == b"A"
    assert run.syncs[b].assignment == b"B" and run.syncs[b].error is None


def test_the_initial_rebalance_waits_its_delay_and_is_extended_by_new_members() -> None:
    run = Run()
    a, reply = run.join()
    assert reply is None and run.classic.state is S.PREPARING_REBALANCE
    run.tick(DELAY_MS - 1)
    assert run.joins == {}, "before the delay nothing completes"
    run.now_ms = 50
    b, _ = run.join()
    run.tick(DELAY_MS)
    assert run.joins == {}, "a member arrived during the delay: extended"
    run.tick(2 * DELAY_MS)
    assert set(run.joins) == {a, b}
    assert run.classic.state is S.COMPLETING_REBALANCE


def test_a_single_member_group_completes_after_the_delay_alone() -> None:
    run = Run()
    a, _ = run.join()
    run.tick(DELAY_MS)
    assert run.joins[a].error is None and run.joins[a].generation_id == 1
    assert run.joins[a].leader == a


def test_protocol_selection_is_by_votes_among_protocols_every_member_supports() -> None:
    run = Run()
    both = (RANGE, ROUND_ROBIN)
    a, _ = run.join(protocols=both)
    b, _ = run.join(protocols=(ROUND_ROBIN, RANGE))
    c, _ = run.join(protocols=(ROUND_ROBIN, RANGE))
    run.tick(DELAY_MS)
    run.tick(2 * DELAY_MS)
    assert run.classic.protocol_name == "roundrobin", "two votes against one"
    assert {m.metadata for m in run.joins[run.classic.leader_id].members} == {b"rr-meta"}

    run2 = Run()
    run2.join(protocols=both)
    run2.join(protocols=both)
    run2.join(protocols=(ROUND_ROBIN,))
    run2.tick(DELAY_MS)
    run2.tick(2 * DELAY_MS)
    assert run2.classic.protocol_name == "roundrobin", "range is not supported by every member"


def test_a_member_whose_protocols_the_group_cannot_share_is_refused() -> None:
    run = Run()
    stable_pair(run)
    _, reply = run.join(protocols=(ROUND_ROBIN,))
    assert reply is not None and reply.error is not None
    assert reply.error.code is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "roundrobin" in reply.error.message
    _, reply = run.join(protocol_type="connect")
    assert reply is not None and reply.error is not None
    assert reply.error.code is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "'connect'" in reply.error.message
    # An empty protocol list or type never joins, even an empty group.
    _, reply = Run().join(protocols=())
    assert reply is not None and code(reply.error) is ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_member_id_required_then_the_second_join_is_accepted() -> None:
    run = Run()
    given, reply = run.join(require_known=True, client_id="rdkafka")
    assert reply is not None and code(reply.error) is ErrorCode.MEMBER_ID_REQUIRED
    assert reply.member_id == given and given.startswith("rdkafka-")
    assert run.classic.pending_members == {given: SESSION_MS}
    assert run.classic.state is S.EMPTY
    _, reply = run.join(given, require_known=True)
    assert reply is None, "parked: the initial rebalance"
    run.tick(DELAY_MS)
    assert run.joins[given].generation_id == 1


def test_a_pending_member_that_never_joins_again_expires_with_its_session() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    pending, _ = run.join(require_known=True)
    run.joins.clear()
    # A rebalance now waits for the pending member too.
    _, parked = run.join(a)
    assert parked is None
    _, parked = run.join(b)
    assert parked is None and run.classic.state is S.PREPARING_REBALANCE
    deadline = run.classic.pending_members[pending]
    run.tick(deadline - 1)
    assert pending in run.classic.pending_members and a not in run.joins
    run.tick(deadline)
    assert pending not in run.classic.pending_members
    assert run.joins[a].generation_id == generation + 1


def test_join_refuses_a_session_timeout_outside_the_range() -> None:
    with pytest.raises(ServiceError) as info:
        Run().join(session_ms=500)
    assert info.value.code is ErrorCode.INVALID_SESSION_TIMEOUT
    assert "500" in info.value.message and "1000..60000" in info.value.message


def test_member_ids_stay_within_the_id_limit() -> None:
    run = Run()
    member_id, _ = run.join(client_id="c" * 600)
    assert len(member_id) <= 249 and member_id.startswith("ccc")


# ---------------------------------------------------------- rebalances


def test_a_rebalance_waits_for_known_members_up_to_the_rebalance_timeout() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    run.now_ms = 1_000
    _, reply = run.join(a)  # the leader rejoins: a rebalance
    assert reply is None and run.classic.state is S.PREPARING_REBALANCE
    assert run.heartbeat(b, generation) is ErrorCode.REBALANCE_IN_PROGRESS
    run.joins.clear()
    # B stays alive (heartbeats) but does not rejoin.
    keep_alive(run, [(b, "")], generation, 1_000 + REBALANCE_MS - 1)
    assert a not in run.joins and b in run.classic.members
    run.tick(1_000 + REBALANCE_MS)
    assert run.joins[a].generation_id == generation + 1
    assert list(run.classic.members) == [a], "B did not rejoin: removed"
    assert [m.member_id for m in run.joins[a].members] == [a]


def test_a_rebalance_completes_as_soon_as_every_member_rejoined() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    run.join(a)
    _, reply = run.join(b)
    assert reply is not None and reply.generation_id == generation + 1, \
        "the last member's join completes the phase and answers it at once"
    assert run.joins[a].generation_id == generation + 1


def test_a_follower_rejoining_unchanged_while_stable_is_answered_at_once() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    _, reply = run.join(b)
    assert reply is not None and reply.generation_id == generation and reply.members == ()
    assert run.classic.state is S.STABLE
    _, reply = run.join(b, protocols=(RANGE, ROUND_ROBIN))
    assert reply is None and run.classic.state is S.PREPARING_REBALANCE, \
        "new metadata: a rebalance"


def test_a_session_that_ends_removes_the_member_and_rebalances() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    deadline_b = run.classic.members[b].deadline_ms
    run.now_ms = deadline_b - 1
    assert run.heartbeat(a, generation) is ErrorCode.NONE
    run.tick(deadline_b)
    assert b not in run.classic.members
    assert run.classic.state is S.PREPARING_REBALANCE
    assert run.heartbeat(a, generation) is ErrorCode.REBALANCE_IN_PROGRESS
    _, reply = run.join(a)
    assert reply is not None and reply.generation_id == generation + 1


def test_heartbeat_renews_the_session() -> None:
    run = Run()
    a, _, generation = stable_pair(run)
    run.now_ms = 5_000
    assert run.heartbeat(a, generation) is ErrorCode.NONE
    assert run.classic.members[a].deadline_ms == 5_000 + SESSION_MS


def test_heartbeat_errors() -> None:
    run = Run()
    a, _, generation = stable_pair(run)
    assert run.heartbeat(a, generation + 1) is ErrorCode.ILLEGAL_GENERATION
    assert run.heartbeat("nobody", generation) is ErrorCode.UNKNOWN_MEMBER_ID
    assert Run().heartbeat("nobody", 0) is ErrorCode.UNKNOWN_MEMBER_ID


def test_sync_errors() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    for member_id, gen, name, expected in (
        (a, generation + 1, "", ErrorCode.ILLEGAL_GENERATION),
        ("nobody", generation, "", ErrorCode.UNKNOWN_MEMBER_ID),
        (a, generation, "roundrobin", ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
    ):
        reply = run.sync(member_id, gen, protocol_name=name)
        assert reply is not None and code(reply.error) is expected, (member_id, gen, name)
    run.join(a)
    reply = run.sync(b, generation)
    assert reply is not None and code(reply.error) is ErrorCode.REBALANCE_IN_PROGRESS


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout() -> None:
    run = Run()
    a, _ = run.join()
    b, _ = run.join()
    run.tick(DELAY_MS)
    run.tick(2 * DELAY_MS)
    generation = run.joins[a].generation_id
    run.sync(a, generation, assignments=[(a, b"A"), (b, b"B")])
    assert run.classic.state is S.STABLE
    # Both alive, but B never sends SyncGroup.
    keep_alive(run, [(a, ""), (b, "")], generation, 2 * DELAY_MS + REBALANCE_MS - 1)
    assert b in run.classic.members and run.classic.state is S.STABLE
    run.tick(2 * DELAY_MS + REBALANCE_MS)
    assert b not in run.classic.members
    assert run.classic.state is S.PREPARING_REBALANCE


def test_a_new_rebalance_answers_parked_syncs_rebalance_in_progress() -> None:
    run = Run()
    a, _ = run.join()
    b, _ = run.join()
    run.tick(DELAY_MS)
    run.tick(2 * DELAY_MS)
    generation = run.joins[a].generation_id
    assert run.sync(b, generation) is None
    run.leave(cl.LeavingMember(a))
    assert code(run.syncs[b].error) is ErrorCode.REBALANCE_IN_PROGRESS


def test_leave_rebalances_and_the_last_leave_empties_the_group() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    assert run.leave(cl.LeavingMember(b), cl.LeavingMember("nobody")) == [
        ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    assert run.classic.state is S.PREPARING_REBALANCE
    assert run.classic.leader_id == a
    run.persisted.clear()
    assert run.leave(cl.LeavingMember(a)) == [ErrorCode.NONE]
    assert run.classic.state is S.EMPTY and run.classic.generation_id == generation + 1
    [record] = run.persisted
    assert record["members"] == [] and record["protocol"] is None, "the emptied group is written"


def test_leave_of_an_unknown_group_answers_each_member() -> None:
    run = Run()
    assert run.leave(cl.LeavingMember("x"), cl.LeavingMember("y")) == [
        ErrorCode.UNKNOWN_MEMBER_ID] * 2


# ------------------------------------------------------- static membership


def static_pair(run: Run) -> tuple[str, str, int]:
    a, _ = run.join(instance_id="ia", client_id="a")
    b, _ = run.join(instance_id="ib", client_id="b")
    run.tick(DELAY_MS)
    run.tick(2 * DELAY_MS)
    generation = run.joins[a].generation_id
    run.sync(a, generation, instance_id="ia", assignments=[(a, b"A"), (b, b"B")])
    run.sync(b, generation, instance_id="ib")
    assert run.classic.state is S.STABLE
    return a, b, generation


@pytest.mark.parametrize("restarting", ["leader", "follower"])
def test_a_static_member_restarts_without_a_rebalance(restarting: str) -> None:
    run = Run()
    a, b, generation = static_pair(run)
    old, instance, assignment = (a, "ia", b"A") if restarting == "leader" else (b, "ib", b"B")
    run.persisted.clear()
    new, reply = run.join(instance_id=instance)
    assert reply is not None and reply.error is None
    assert new != old and reply.member_id == new
    assert reply.generation_id == generation and run.classic.state is S.STABLE
    # A restarted leader is told the leader before the restart, so it does
    # not assign again; it syncs and gets its assignment back.
    assert reply.leader == a and reply.members == ()
    [record] = run.persisted
    assert new in {m["member_id"] for m in record["members"]}
    synced = run.sync(new, generation, instance_id=instance)
    assert synced is not None and synced.assignment == assignment
    # The old process is fenced.
    assert run.heartbeat(old, generation, instance_id=instance) is ErrorCode.FENCED_INSTANCE_ID
    assert run.heartbeat(new, generation, instance_id=instance) is ErrorCode.NONE


def test_a_static_member_whose_protocols_change_the_selection_rebalances() -> None:
    run = Run()
    both = (RANGE, ROUND_ROBIN)
    a, _ = run.join(instance_id="ia", protocols=both)
    b, _ = run.join(instance_id="ib", protocols=both)
    run.tick(DELAY_MS)
    run.tick(2 * DELAY_MS)
    run.sync(a, 1, instance_id="ia")
    assert run.classic.protocol_name == "range"
    _, reply = run.join(instance_id="ib", protocols=(ROUND_ROBIN,))
    assert reply is None and run.classic.state is S.PREPARING_REBALANCE


def test_a_parked_call_of_a_replaced_static_member_is_fenced() -> None:
    run = Run()
    a, b, generation = static_pair(run)
    run.join(a, instance_id="ia")  # the leader rejoins: rebalance, parked
    new, _ = run.join(instance_id="ia")
    assert code(run.joins[a].error) is ErrorCode.FENCED_INSTANCE_ID
    assert run.classic.leader_id == new


def test_static_members_that_do_not_rejoin_stay_through_the_join_phase() -> None:
    run = Run()
    a, b, generation = static_pair(run)
    run.join(a, instance_id="ia")
    # B is alive (heartbeats) but slow: it does not rejoin in time.
    keep_alive(run, [(b, "ib")], generation, run.now_ms + REBALANCE_MS)
    assert set(run.classic.members) == {a, b}, "static: kept across a slow restart"
    assert run.joins[a].generation_id == generation + 1
    assert {m.member_id for m in run.joins[a].members} == {a, b}


# -------------------------------------------------------------- offsets


@pytest.mark.parametrize(("member", "instance", "generation", "transactional", "expected"), [
    ("a", "", 1, False, ErrorCode.NONE),
    ("a", "", 2, False, ErrorCode.ILLEGAL_GENERATION),
    ("x", "", 1, False, ErrorCode.UNKNOWN_MEMBER_ID),
    ("", "", -1, False, ErrorCode.UNKNOWN_MEMBER_ID),
    ("", "", -1, True, ErrorCode.NONE),
    ("a", "ia", 1, True, ErrorCode.NONE),
    ("a", "ib", 1, True, ErrorCode.FENCED_INSTANCE_ID),
    ("a", "nope", 1, True, ErrorCode.UNKNOWN_MEMBER_ID),
])
def test_which_commits_a_stable_group_accepts(member: str, instance: str, generation: int,
                                              transactional: bool, expected: ErrorCode) -> None:
    group = cl.ClassicGroup(
        group_id=GROUP, generation_id=1, protocol_type="consumer", protocol_name="range",
        leader_id="a", state=S.STABLE,
        members={m: cl.ClassicMember(member_id=m, instance_id=f"i{m}", rebalance_timeout_ms=1,
                                     session_timeout_ms=1, protocol_type="consumer",
                                     protocols=(RANGE,)) for m in ("a", "b")},
    )
    try:
        cl.check_offset_commit(group, member_id=member, instance_id=instance,
                               generation_id=generation, transactional=transactional)
        got = ErrorCode.NONE
    except ServiceError as exc:
        got = exc.code
    assert got is expected


def test_commits_while_the_leader_assigns_and_outside_the_group() -> None:
    run = Run()
    a, _ = run.join()
    run.tick(DELAY_MS)
    assert run.classic.state is S.COMPLETING_REBALANCE
    with pytest.raises(ServiceError) as info:
        cl.check_offset_commit(run.classic, member_id=a, instance_id="", generation_id=1,
                               transactional=False)
    assert info.value.code is ErrorCode.REBALANCE_IN_PROGRESS
    cl.check_offset_commit(run.classic, member_id=a, instance_id="", generation_id=1,
                           transactional=True)
    empty = cl.ClassicGroup(group_id=GROUP, generation_id=4)
    cl.check_offset_commit(empty, member_id="", instance_id="", generation_id=-1,
                           transactional=False)
    with pytest.raises(ServiceError) as info:
        cl.check_offset_commit(empty, member_id="gone", instance_id="", generation_id=4,
                               transactional=False)
    assert info.value.code is ErrorCode.UNKNOWN_MEMBER_ID


# ---------------------------------------------------- one type per group id


def consumer_group(members: int) -> gr.Group:
    return gr.Group(group_id=GROUP, epoch=3, members={
        f"m{i}": gr.Member(member_id=f"m{i}", topics=frozenset({"t"})) for i in range(members)})


def test_a_classic_join_to_a_consumer_group_in_use_is_inconsistent() -> None:
    run = Run(group=consumer_group(1))
    _, reply = run.join()
    assert reply is not None and code(reply.error) is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert isinstance(run.group, gr.Group), "the consumer group is left as it was"
    for answer in (run.sync("m0", 3), ):
        assert answer is not None and code(answer.error) is ErrorCode.UNKNOWN_MEMBER_ID
    assert run.heartbeat("m0", 3) is ErrorCode.UNKNOWN_MEMBER_ID


def test_an_empty_group_of_either_type_may_change_type() -> None:
    run = Run(group=consumer_group(0))
    run.join()
    assert isinstance(run.group, cl.ClassicGroup)
    assert cl.consumer_group_or_none(cl.ClassicGroup(group_id=GROUP), GROUP) is None
    busy = Run()
    stable_pair(busy)
    with pytest.raises(ServiceError) as info:
        cl.consumer_group_or_none(busy.group, GROUP)
    assert info.value.code is ErrorCode.GROUP_ID_NOT_FOUND
    assert "classic" in info.value.message


# ---------------------------------------------------------- the record


def test_the_record_replays_to_the_stable_group() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    record = run.persisted[-1]
    assert set(record) == {"type", "protocol_type", "generation", "protocol", "leader",
                           "current_state_timestamp", "members"}
    loaded = cl.from_snapshot(GROUP, record)
    assert loaded.state is S.STABLE and loaded.generation_id == generation
    assert loaded.leader_id == a and list(loaded.members) == [a, b]
    assert {m: x.assignment for m, x in loaded.members.items()} == {a: b"to-a", b: b"to-b"}
    assert cl.snapshot(loaded) == record
    assert all(m.deadline_ms == -1 for m in loaded.members.values())
    started = cl.start_sessions(loaded, now_ms=7)
    assert {m.deadline_ms for m in started.members.values()} == {7 + SESSION_MS}
    # Members rejoin the loaded group and it rebalances as usual.
    replay = Run(group=started, now_ms=10)
    replay.join(a)
    _, reply = replay.join(b)
    assert reply is not None and reply.generation_id == generation + 1


def test_an_empty_group_replays_empty() -> None:
    loaded = cl.from_snapshot(GROUP, {"type": "classic", "protocol_type": "consumer",
                                      "generation": 5, "protocol": None, "leader": None,
                                      "current_state_timestamp": 1, "members": []})
    assert (loaded.state, loaded.generation_id, loaded.members) == (S.EMPTY, 5, {})


# -------------------------------------------------- planners change nothing


def test_planners_never_change_the_group_they_are_given() -> None:
    run = Run()
    a, b, generation = stable_pair(run)
    before = run.classic
    kept = copy.deepcopy(before)
    run.join(a)
    run.join(instance_id="x")
    run.sync(a, generation + 7)
    run.leave(cl.LeavingMember(b))
    cl.plan_tick(before, now_ms=10**9, config=CONFIG)
    assert before == kept


# ------------------------------------------------------ consumer protocol


def _string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def test_consumer_protocol_subscription_and_assignment_are_read() -> None:
    subscription = (b"\x00\x01" + (2).to_bytes(4, "big") + _string("a") + _string("bb")
                    + (-1).to_bytes(4, "big", signed=True) + b"\x00\x00\x00\x00")
    assert consumer_protocol.subscribed_topics(subscription) == ("a", "bb")
    assignment = (b"\x00\x00" + (1).to_bytes(4, "big") + _string("a") + (2).to_bytes(4, "big")
                  + (0).to_bytes(4, "big") + (3).to_bytes(4, "big") + b"\xff\xff\xff\xff")
    assert consumer_protocol.assigned_partitions(assignment) == (("a", 0), ("a", 3))
    assert consumer_protocol.assigned_partitions(b"") == ()
    for broken in (b"\x00", b"\x00\x00\x7f\xff\xff\xff", subscription[:9]):
        assert consumer_protocol.subscribed_topics(broken) is None
        assert consumer_protocol.assigned_partitions(broken) is None


# ------------------------------------------------- random runs, invariants


def check_invariants(group: cl.ClassicGroup, parked_joins: set[str],
                     parked_syncs: set[str]) -> None:
    members = group.members
    assert (group.leader_id in members) if members else group.leader_id == ""
    if group.state is S.EMPTY:
        assert not members
    if group.state in (S.COMPLETING_REBALANCE, S.STABLE):
        assert group.protocol_name and all(
            group.protocol_name in m.protocol_names for m in members.values())
        assert not any(m.awaiting_join for m in members.values())
    if group.state is not S.COMPLETING_REBALANCE:
        assert not any(m.awaiting_sync for m in members.values())
    instances = [m.instance_id for m in members.values() if m.instance_id]
    assert len(instances) == len(set(instances))
    # What the runtime holds futures for is exactly what the core parks:
    # no call is left unanswered, none answered twice.
    assert parked_joins == {m.member_id for m in members.values() if m.awaiting_join}
    assert parked_syncs == {m.member_id for m in members.values() if m.awaiting_sync}


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    run = Run()
    parked_joins: set[str] = set()
    parked_syncs: set[str] = set()
    known: dict[str, str] = {}  # member ids the "clients" hold -> instance id
    generation_of: dict[str, int] = {}
    seen: set[S] = set()

    def settle(before_joins: dict[str, cl.JoinReply],
               before_syncs: dict[str, cl.SyncReply]) -> None:
        for member_id, reply in run.joins.items():
            if before_joins.get(member_id) is not reply:
                assert member_id in parked_joins, f"answered a join never parked: {member_id}"
                parked_joins.discard(member_id)
                if reply.error is None:
                    generation_of[member_id] = reply.generation_id
        for member_id, synced in run.syncs.items():
            if before_syncs.get(member_id) is not synced:
                assert member_id in parked_syncs, f"answered a sync never parked: {member_id}"
                parked_syncs.discard(member_id)

    for _step in range(80):
        before_joins, before_syncs = dict(run.joins), dict(run.syncs)
        action = rng.choice(["join", "join", "rejoin", "sync", "beat", "leave", "tick",
                             "tick", "static"])
        run.now_ms += rng.choice([0, 50, 500, 3_000])
        protocols = rng.choice([(RANGE,), (RANGE, ROUND_ROBIN), (ROUND_ROBIN, RANGE)])
        if action in ("join", "static", "rejoin") and (known or action != "rejoin"):
            if action == "rejoin":
                member_id = rng.choice(sorted(known))
                instance = known[member_id]
                run.join(member_id, instance_id=instance, protocols=protocols)
            else:
                instance = rng.choice(["s1", "s2"]) if action == "static" else ""
                member_id, _ = run.join(instance_id=instance, protocols=protocols,
                                        require_known=rng.random() < 0.3)
                known[member_id] = instance
            parked_as = run.last_call_member_id
            # As the runtime: a call parked under a member id takes the place
            # of that member's older parked call (answered, superseded), and
            # one answered in its own step leaves nothing parked.
            if parked_as:
                settle(before_joins, before_syncs)
                before_joins, before_syncs = dict(run.joins), dict(run.syncs)
                parked_joins.discard(parked_as)
                if run.classic.members.get(parked_as, None) is not None and \
                        run.classic.members[parked_as].awaiting_join:
                    parked_joins.add(parked_as)
        elif known and action == "sync":
            member_id = rng.choice(sorted(known))
            group = run.group
            assignments = ([(m, m.encode()) for m in group.members]
                           if isinstance(group, cl.ClassicGroup) else [])
            reply_sync = run.sync(member_id, generation_of.get(member_id, 0),
                                  instance_id=known[member_id], assignments=assignments)
            if reply_sync is None:
                parked_syncs.add(member_id)
        elif known and action == "beat":
            member_id = rng.choice(sorted(known))
            run.heartbeat(member_id, generation_of.get(member_id, 0),
                          instance_id=known[member_id])
        elif known and action == "leave":
            member_id = rng.choice(sorted(known))
            run.leave(cl.LeavingMember(member_id, known[member_id]))
        elif isinstance(run.group, cl.ClassicGroup):
            run.tick(run.now_ms)
        settle(before_joins, before_syncs)
        if isinstance(run.group, cl.ClassicGroup):
            check_invariants(run.group, parked_joins, parked_syncs)
            seen.add(run.group.state)
    # The run went through the protocol, not around it.
    assert seen >= {S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE}, seen
