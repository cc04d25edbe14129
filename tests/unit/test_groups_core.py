"""The group coordinator's pure cores: assignment, membership, offsets replay.

Goal: the properties docs/groups.md promises hold for any sequence of
events, not just the ones the integration tests happen to produce:
* the assignor gives every partition of a subscribed topic exactly one
  subscribed member, keeps members' partitions where balance allows, and
  leaves no partition movable to a member with two fewer;
* membership never lets two members own a partition at the same time, and a
  group whose members keep heartbeating converges to every member owning
  exactly its target in the group's epoch;
* replaying __consumer_offsets gives pending transactional offsets that a
  COMMIT marker materializes (unless a newer plain commit exists) and an
  ABORT marker drops, and the sequence the next transactional write needs.

Method: table cases plus seeded random runs (the seed is in the test id).
"""

from __future__ import annotations

import random

import pytest

from oncelog.errors import ErrorCode
from oncelog.records import MARKER_ABORT, MARKER_COMMIT
from services.common.kernel.errors import ServiceError
from services.group_coordinator.core import groups as gr
from services.group_coordinator.core.assignor import assign
from services.group_coordinator.core.offsets_log import (
    BatchView,
    OffsetsPartitionState,
    encode_group,
    encode_offset,
)

TP = tuple[str, int]


def check_assignment(subs: dict[str, frozenset[str]], counts: dict[str, int],
                     out: dict[str, frozenset[TP]]) -> None:
    owners: dict[TP, str] = {}
    for member, parts in out.items():
        for tp in parts:
            assert tp not in owners, f"{tp} assigned twice"
            assert tp[0] in subs[member], f"{tp} given to {member}, not subscribed"
            owners[tp] = member
    wanted = {(t, p) for s in subs.values() for t in s for p in range(counts.get(t, 0))}
    assert set(owners) == wanted
    for tp, holder in owners.items():
        for other, topics in subs.items():
            if tp[0] in topics:
                assert len(out[holder]) - len(out[other]) <= 1, (tp, holder, other, out)


def test_assignor_balances_and_is_sticky() -> None:
    subs = {m: frozenset({"a", "b"}) for m in ("m1", "m2")}
    counts = {"a": 3, "b": 3}
    first = assign(subs, {}, counts)
    check_assignment(subs, counts, first)
    subs3 = {**subs, "m3": frozenset({"a", "b"})}
    second = assign(subs3, first, counts)
    check_assignment(subs3, counts, second)
    assert second["m1"] <= first["m1"] and second["m2"] <= first["m2"]
    assert assign(subs3, first, counts) == second, "deterministic"


@pytest.mark.parametrize("seed", range(30))
def test_assignor_random(seed: int) -> None:
    rng = random.Random(seed)
    topics = ["t0", "t1", "t2"]
    counts = {t: rng.randint(0, 7) for t in topics}
    current: dict[str, frozenset[TP]] = {}
    for _ in range(6):
        members = [f"m{i}" for i in range(rng.randint(1, 5))]
        subs = {m: frozenset(rng.sample(topics, rng.randint(1, 3))) for m in members}
        out = assign(subs, current, counts)
        check_assignment(subs, counts, out)
        current = out


def beat(group: gr.Group | None, member_id: str, epoch: int, owned: frozenset[TP], *,
         topics: frozenset[str] = frozenset({"t"}), counts: dict[str, int] | None = None,
         instance_id: str = "", new_member_id: str = "new-x") -> gr.HeartbeatResult:
    return gr.plan_heartbeat(
        group, group_id="g", member_id=member_id, member_epoch=epoch, instance_id=instance_id,
        topics=topics, session_timeout_ms=3000, owned_partitions=owned,
        new_member_id=new_member_id, partition_counts=counts or {"t": 6},
        min_session_timeout_ms=1000, max_session_timeout_ms=10_000,
    )


def assert_disjoint(group: gr.Group) -> None:
    seen: set[TP] = set()
    for m in group.members.values():
        assert not (seen & m.owned), f"partition owned twice: {seen & m.owned}"
        seen |= m.owned


@pytest.mark.parametrize("seed", range(40))
def test_membership_random_runs_never_double_own_and_converge(seed: int) -> None:
    rng = random.Random(seed)
    group: gr.Group | None = None
    # What each live client believes it owns (it acknowledges revocations
    # only sometimes, to exercise slow members).
    clients: dict[str, tuple[int, frozenset[TP]]] = {}
    counter = 0
    for _step in range(120):
        action = rng.random()
        if action < 0.15 or not clients:
            counter += 1
            joined = f"m{counter}"
            group = beat(group, "", 0, frozenset(), new_member_id=joined).group
            clients[joined] = (group.members[joined].member_epoch,
                               group.members[joined].assignment)
        elif action < 0.25:
            member_id = rng.choice(sorted(clients))
            assert group is not None
            group = gr.plan_remove_members(group, [member_id], {"t": 6})
            del clients[member_id]
        else:
            member_id = rng.choice(sorted(clients))
            epoch, owned = clients[member_id]
            assert group is not None
            result = beat(group, member_id, epoch, owned)
            group = result.group
            m = group.members[member_id]
            keep_old = rng.random() < 0.3
            clients[member_id] = (m.member_epoch, owned if keep_old else m.assignment)
        assert group is not None
        assert_disjoint(group)
        for member_id, (_epoch, owned) in clients.items():
            # What a client believes it owns is never owned by another member.
            for other_id, other in group.members.items():
                if other_id != member_id:
                    assert not (owned & other.owned), "two members process one partition"
    # Converge: everyone heartbeats and acknowledges.
    assert group is not None
    for _ in range(10):
        for member_id in sorted(clients):
            epoch, _owned = clients[member_id]
            result = beat(group, member_id, epoch, clients[member_id][1])
            group = result.group
            clients[member_id] = (group.members[member_id].member_epoch,
                                  group.members[member_id].assignment)
    if clients:
        assert group.state is gr.GroupState.STABLE
        assert sum(len(m.owned) for m in group.members.values()) == 6


def test_heartbeat_refusals_change_nothing() -> None:
    group = beat(None, "", 0, frozenset()).group
    cases = [
        (lambda: beat(group, "ghost", 1, frozenset()), ErrorCode.UNKNOWN_MEMBER_ID),
        (lambda: beat(group, "new-x", 99, frozenset()), ErrorCode.FENCED_MEMBER_EPOCH),
        (lambda: beat(group, "", 0, frozenset(), topics=frozenset()), ErrorCode.INVALID_REQUEST),
    ]
    for call, code in cases:
        with pytest.raises(ServiceError) as info:
            call()
        assert info.value.code is code
    with pytest.raises(ServiceError) as info:
        gr.plan_heartbeat(
            group, group_id="g", member_id="", member_epoch=0, instance_id="", topics={"t"},
            session_timeout_ms=50, owned_partitions=(), new_member_id="y",
            partition_counts={"t": 6}, min_session_timeout_ms=1000, max_session_timeout_ms=9000,
        )
    assert info.value.code is ErrorCode.INVALID_REQUEST


def test_commit_checks() -> None:
    group = beat(None, "", 0, frozenset()).group
    member = group.members["new-x"]
    assert gr.check_commit_member(group, group_id="g", member_id="new-x",
                                  generation_id=member.member_epoch,
                                  partitions=[("t", 0)]) == {}
    refused = gr.check_commit_member(group, group_id="g", member_id="new-x",
                                     generation_id=member.member_epoch, partitions=[("t", 99)])
    assert refused[("t", 99)].code is ErrorCode.STALE_MEMBER_EPOCH
    with pytest.raises(ServiceError) as info:
        gr.check_commit_member(group, group_id="g", member_id="", generation_id=-1,
                               partitions=[("t", 0)])
    assert info.value.code is ErrorCode.UNKNOWN_MEMBER_ID
    assert gr.check_commit_member(None, group_id="g", member_id="", generation_id=-1,
                                  partitions=[("t", 0)]) == {}


def data(state: OffsetsPartitionState, base: int, entries: list[tuple[bytes, bytes | None]],
         producer: tuple[int, int, int] | None = None) -> int:
    pid, epoch, seq = producer or (-1, -1, -1)
    state.replay(BatchView(
        base_offset=base, next_offset=base + len(entries), producer_id=pid, producer_epoch=epoch,
        last_sequence=seq + len(entries) - 1 if producer else -1,
        is_transactional=producer is not None, is_control=False,
        records=[(base + i, k, v) for i, (k, v) in enumerate(entries)],
    ))
    return base + len(entries)


def marker(state: OffsetsPartitionState, base: int, pid: int, epoch: int, kind: int) -> int:
    state.replay(BatchView(base_offset=base, next_offset=base + 1, producer_id=pid,
                           producer_epoch=epoch, last_sequence=-1, is_transactional=True,
                           is_control=True, control_type=kind))
    return base + 1


def test_offsets_replay_pending_commit_abort_and_sequences() -> None:
    s = OffsetsPartitionState()
    end = data(s, 0, [encode_offset("g", ("t", 0), 5, "", 1)])
    end = data(s, end, [encode_offset("g", ("t", 0), 9, "", 2),
                        encode_offset("g", ("t", 1), 3, "", 2)], producer=(7, 0, 0))
    assert s.offsets["g"][("t", 0)].offset == 5
    assert s.has_pending("g", ("t", 0)) and s.next_sequence_for(7, 0) == 2
    end = marker(s, end, 7, 1, MARKER_COMMIT)
    assert {tp: c.offset for tp, c in s.offsets["g"].items()} == {("t", 0): 9, ("t", 1): 3}
    assert not s.has_pending("g", ("t", 0)) and s.next_sequence_for(7, 1) == 0
    end = data(s, end, [encode_offset("g", ("t", 0), 20, "", 3)], producer=(7, 1, 0))
    end = marker(s, end, 7, 2, MARKER_ABORT)
    assert s.offsets["g"][("t", 0)].offset == 9, "aborted offsets are dropped"
    # A plain commit appended after pending offsets wins over them.
    end = data(s, end, [encode_offset("g", ("t", 1), 30, "", 4)], producer=(8, 0, 0))
    end = data(s, end, [encode_offset("g", ("t", 1), 40, "", 5)])
    end = marker(s, end, 8, 1, MARKER_COMMIT)
    assert s.offsets["g"][("t", 1)].offset == 40
    group = beat(None, "", 0, frozenset()).group
    data(s, end, [encode_group(group)])
    assert s.groups["g"] == group
